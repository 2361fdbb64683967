"""Exact search: over dense embedding vectors block by block (`eval retrieval`, `unmask mine`), and over sparse
vectors through an inverted index (BM25, SPLADE)."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import numpy as np

QUERY_BLOCK, DOC_BLOCK = 1024, 16384


def exact_search(queries: np.ndarray, docs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best documents of each query by dot product, best first: ((Q, k) indices, (Q, k) scores). Queries
    (float32) and documents (float32 or float16) are multiplied a block of each at a time, keeping a running top-k,
    so memory is bounded by the block sizes whatever the corpus size."""
    k = min(k, len(docs))
    all_ids, all_scores = [], []
    for q0 in range(0, len(queries), QUERY_BLOCK):
        block = queries[q0 : q0 + QUERY_BLOCK].astype(np.float32)
        best_ids = np.zeros((len(block), 0), dtype=np.int64)
        best_scores = np.zeros((len(block), 0), dtype=np.float32)
        for d0 in range(0, len(docs), DOC_BLOCK):
            scores = block @ np.asarray(docs[d0 : d0 + DOC_BLOCK], dtype=np.float32).T  # (q, d)
            ids = np.broadcast_to(np.arange(d0, d0 + scores.shape[1]), scores.shape)
            merged_scores = np.concatenate([best_scores, scores], axis=1)
            merged_ids = np.concatenate([best_ids, ids], axis=1)
            keep = np.argpartition(-merged_scores, min(k, merged_scores.shape[1]) - 1, axis=1)[:, :k]
            best_scores = np.take_along_axis(merged_scores, keep, axis=1)
            best_ids = np.take_along_axis(merged_ids, keep, axis=1)
        order = np.argsort(-best_scores, axis=1, kind="stable")
        all_ids.append(np.take_along_axis(best_ids, order, axis=1))
        all_scores.append(np.take_along_axis(best_scores, order, axis=1))
    return np.concatenate(all_ids), np.concatenate(all_scores)


class InvertedIndex:
    """Sparse document vectors ({term: weight}) kept by term, so a query touches only its terms' postings: the
    search of BM25 and of SPLADE vectors. Scores are dot products."""

    def __init__(self, documents: Iterable[dict]):
        by_term: dict = defaultdict(lambda: ([], []))
        self.size = 0
        for doc, vector in enumerate(documents):
            self.size = doc + 1
            for term, weight in vector.items():
                ids, weights = by_term[term]
                ids.append(doc)
                weights.append(weight)
        self.postings = {term: (np.array(ids, dtype=np.int64), np.array(weights, dtype=np.float32))
                         for term, (ids, weights) in by_term.items()}

    def scores(self, query: dict) -> np.ndarray:
        """(N,) the query vector's dot product with every document."""
        total = np.zeros(self.size, dtype=np.float32)
        for term, weight in query.items():
            if term in self.postings:
                ids, weights = self.postings[term]
                total[ids] += weight * weights
        return total

    def search(self, queries: Iterable[dict], k: int) -> np.ndarray:
        """(Q, k) the best documents of each query, best first."""
        k = min(k, self.size)
        rows = []
        for query in queries:
            scores = self.scores(query)
            top = np.argpartition(-scores, k - 1)[:k]
            rows.append(top[np.argsort(-scores[top], kind="stable")])
        return np.array(rows, dtype=np.int64).reshape(-1, k)
