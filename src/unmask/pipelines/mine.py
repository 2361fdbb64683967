"""Hard-negative mining (`unmask mine`): for each judged (query, document) pair of a BEIR training set, documents the
model ranks high for the query but nobody judged relevant: the n-tuples `finetune embed` and `finetune pair` read.

The corpus is embedded once (length-sorted batches) and its vectors kept on disk as float16, keyed by the model's
weights and the corpus file, so a second run reuses them. The search is `exact_search`: block by block, never a
queries x documents matrix.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from unmask.data.readers import read_beir
from unmask.errors import UsageError
from unmask.io import atomic_write
from unmask.pipelines.classify import pair_scores
from unmask.pipelines.search import exact_search
from unmask.progress import progress

CORPUS_CHUNK = 32_768  # documents tokenized and embedded at a time


def corpus_vectors(encoder, doc_texts: list[str], key: str, cache_dir: Path | None, batch_size: int) -> np.ndarray:
    """(N, H) float16 unit vectors of the documents, read from `cache_dir/key.npy` when an earlier run wrote it.
    Documents are tokenized and embedded CORPUS_CHUNK at a time, into the cache file itself when there is one, so
    memory does not grow with the corpus beyond its text."""
    path = cache_dir / f"{key}.npy" if cache_dir else None
    if path is not None and path.exists():
        vectors = np.load(path, mmap_mode="r")
        if vectors.shape[0] == len(doc_texts):
            print(f"mine: reusing the corpus vectors in {path}", file=sys.stderr)
            return vectors
    shape = (len(doc_texts), encoder.dimension)

    def fill(vectors: np.ndarray) -> None:
        with progress(total=len(doc_texts), desc="embedding the corpus", unit="doc") as bar:
            for start in range(0, len(doc_texts), CORPUS_CHUNK):
                chunk = doc_texts[start : start + CORPUS_CHUNK]
                vectors[start : start + len(chunk)] = encoder.encode(chunk, batch_size=batch_size, normalize=True,
                                                                     show_progress=False)
                bar.update(len(chunk))

    if path is None:
        vectors = np.empty(shape, dtype=np.float16)
        fill(vectors)
        return vectors

    def save(temporary: Path) -> None:  # written in place: a killed run never leaves half a cache under its name
        vectors = np.lib.format.open_memmap(temporary, mode="w+", dtype=np.float16, shape=shape)
        fill(vectors)
        vectors.flush()
        del vectors

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, save)
    return np.load(path, mmap_mode="r")


def cache_key(model_dir: str | Path, corpus: str | Path, max_seq_length: int) -> str:
    """The model's weights and the corpus file, by name, size and modification time."""
    h = hashlib.sha256()
    for path in sorted(Path(model_dir).glob("*.safetensors")) + [Path(corpus)]:
        stat = path.resolve().stat()
        h.update(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    h.update(str(max_seq_length).encode())
    return h.hexdigest()[:20]


def mine_hard_negatives(encoder, model_dir: str | Path, corpus: str, queries: str, qrels: str,
                        num_negatives: int = 3, range_min: int = 10, range_max: int = 50, margin: float | None = None,
                        max_score: float | None = None, batch_size: int = 64, cache_dir: str | Path | None = None,
                        cross_encoder=None) -> tuple[list[dict], int]:
    """Rows {anchor, positive, negative_1..negative_k} and the number of judged pairs left out (too few negatives
    passed the filters). Negatives come from ranks [range_min, range_max) of the query's search, never a judged
    document; `margin` drops those scoring above the positive's score minus it, `max_score` those above it.

    With a `cross_encoder` (model, tokenizer), the positives and those candidates are rescored by it (its relevance
    logit), the filters read its scores, the hardest it scores are taken, and each row gets `label`: its scores of
    the positive and each negative, which `finetune embed` distils."""
    doc_ids, doc_texts, query_ids, query_texts, relevance = read_beir(corpus, queries, qrels)
    if not 0 <= range_min < range_max or range_max > len(doc_ids) or num_negatives > range_max - range_min:
        raise UsageError(f"--range_min {range_min} / --range_max {range_max} must satisfy 0 <= min < max <= the "
                         f"{len(doc_ids):,} documents of {corpus}, with room for --num_negatives {num_negatives}")
    docs = corpus_vectors(encoder, doc_texts, cache_key(model_dir, corpus, encoder.max_seq_length),
                          Path(cache_dir) if cache_dir else None, batch_size)
    query_vectors = encoder.encode(query_texts, batch_size=batch_size, normalize=True)
    ranked, scores = exact_search(query_vectors, docs, range_max)
    position = {doc: i for i, doc in enumerate(doc_ids)}
    judged = [{position[doc] for doc in relevance[qid]} for qid in query_ids]
    positives = [[position[doc] for doc, grade in relevance[qid].items() if grade > 0] for qid in query_ids]
    candidates = [[(int(d), float(s)) for d, s in zip(ranked[q, range_min:], scores[q, range_min:])
                   if d not in judged[q]] for q in range(len(query_ids))]  # best first
    if cross_encoder is not None:
        positive_scores, candidates = _rescored(cross_encoder, query_texts, doc_texts, positives, candidates,
                                                batch_size)
    else:
        positive_scores = [[float(query_vectors[q] @ docs[d].astype(np.float32)) for d in row]
                           for q, row in enumerate(positives)]
    rows, left_out = [], 0
    for q, query in enumerate(query_texts):
        for doc, positive_score in zip(positives[q], positive_scores[q]):
            negatives = [(d, s) for d, s in candidates[q] if (margin is None or s <= positive_score - margin)
                         and (max_score is None or s <= max_score)][:num_negatives]
            if len(negatives) < num_negatives:
                left_out += 1
                continue
            row = {"anchor": query, "positive": doc_texts[doc],
                   **{f"negative_{i + 1}": doc_texts[d] for i, (d, _) in enumerate(negatives)}}
            if cross_encoder is not None:
                row["label"] = [positive_score, *(s for _, s in negatives)]
            rows.append(row)
    return rows, left_out


def _rescored(cross_encoder, query_texts: list[str], doc_texts: list[str], positives: list[list[int]],
              candidates: list[list[tuple[int, float]]], batch_size: int):
    """The cross-encoder's relevance logits of each query's positives, and its candidates rescored by it, hardest
    first. Every pair is scored in one length-sorted pass."""
    model, tokenizer = cross_encoder
    pairs = [(query_texts[q], doc_texts[d]) for q in range(len(query_texts))
             for d in [*positives[q], *(d for d, _ in candidates[q])]]
    print(f"mine: rescoring {len(pairs):,} (query, document) pairs with the cross-encoder", file=sys.stderr)
    flat, start = pair_scores(model, tokenizer, pairs, "truncate", batch_size=batch_size).tolist(), 0
    positive_scores, rescored = [], []
    for row, found in zip(positives, candidates):
        positive_scores.append(flat[start : start + len(row)])
        start += len(row)
        rescored.append(sorted(((d, s) for (d, _), s in zip(found, flat[start : start + len(found)])),
                               key=lambda pair: -pair[1]))
        start += len(found)
    return positive_scores, rescored


def write_rows(rows: list[dict], output: str | Path) -> None:
    with open(output, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
