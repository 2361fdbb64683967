"""Exact nearest-neighbour search over embedding vectors, the one search of `eval retrieval` and `unmask mine`."""

from __future__ import annotations

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
