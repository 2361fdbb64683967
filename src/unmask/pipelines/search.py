"""Exact search: over dense embedding vectors block by block (`eval retrieval`, `unmask mine`), and over sparse
vectors through an inverted index (BM25, SPLADE)."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

QUERY_BLOCK, DOC_BLOCK = 1024, 16384
SCORE_BLOCK = 2**24  # the sparse search's (queries, documents) scores held at once


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


@dataclass
class SparseVectors:
    """Sparse vectors in compressed rows (CSR): vector i has the weights values[indptr[i]:indptr[i+1]] at the
    dimensions indices[indptr[i]:indptr[i+1]], ascending. Memory is 8 bytes a non-zero weight whatever their number
    (a dense SPLADE vector of an undertrained model included), not a Python dict's hundred."""

    indptr: np.ndarray  # (N + 1,) int64
    indices: np.ndarray  # (nnz,) int32
    values: np.ndarray  # (nnz,) float32
    width: int  # the vectors' dimension (a vocabulary's size)

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[np.ndarray, np.ndarray]], width: int) -> SparseVectors:
        """From each vector's (dimensions ascending, weights)."""
        lengths = np.fromiter((len(ids) for ids, _ in rows), dtype=np.int64, count=len(rows))
        indptr = np.concatenate([[0], np.cumsum(lengths)])
        indices = np.concatenate([np.zeros(0, np.int32), *(ids for ids, _ in rows)]).astype(np.int32, copy=False)
        values = np.concatenate([np.zeros(0, np.float32), *(w for _, w in rows)]).astype(np.float32, copy=False)
        return cls(indptr, indices, values, width)

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def __getitem__(self, rows: slice) -> SparseVectors:
        """The vectors of a slice of rows (views, no copy)."""
        start, stop, _ = rows.indices(len(self))
        stop = max(start, stop)
        span = slice(self.indptr[start], self.indptr[stop])
        return SparseVectors(self.indptr[start : stop + 1] - self.indptr[start], self.indices[span],
                             self.values[span], self.width)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Vector i's (dimensions, weights)."""
        span = slice(self.indptr[i], self.indptr[i + 1])
        return self.indices[span], self.values[span]

    def as_dict(self, i: int) -> dict[int, float]:
        """Vector i as {dimension: weight}, largest first: what `embed --sparse` and /embed_sparse write."""
        ids, weights = self.row(i)
        order = np.argsort(-weights, kind="stable")
        return dict(zip(ids[order].tolist(), weights[order].tolist()))

    def dense(self) -> np.ndarray:
        """(N, width) float32."""
        out = np.zeros((len(self), self.width), dtype=np.float32)
        out[np.repeat(np.arange(len(self)), np.diff(self.indptr)), self.indices] = self.values
        return out

    def csr(self) -> torch.Tensor:
        """The vectors as a torch CSR matrix (N, width) sharing this memory where the index types allow."""
        return _csr(self.indptr, self.indices, self.values, (len(self), self.width))


@contextmanager
def _sparse_csr_quietly():
    """torch warns on every use that its sparse CSR layout is beta and that invariant checks are off (the arrays are
    built here, in order); the product used is MKL's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def _csr(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, shape: tuple[int, int]) -> torch.Tensor:
    index_type = torch.int32 if indptr[-1] < 2**31 else torch.int64
    with _sparse_csr_quietly():
        rows, columns = torch.from_numpy(indptr).to(index_type), torch.from_numpy(indices).to(index_type)
        return torch.sparse_csr_tensor(rows, columns, torch.from_numpy(values), shape, check_invariants=False)


class InvertedIndex:
    """Document vectors kept by dimension: row t of `postings`, a (width, N) CSR matrix, lists the documents with a
    non-zero weight for term t. A block of queries times it touches only their terms' postings: the search of BM25
    and SPLADE vectors, by dot product."""

    def __init__(self, documents: SparseVectors):
        self.size, self.width = len(documents), documents.width
        by_term = np.argsort(documents.indices, kind="stable")  # documents in order within each term
        document_of = np.repeat(np.arange(self.size, dtype=np.int32), np.diff(documents.indptr))[by_term]
        indptr = np.concatenate([[0], np.cumsum(np.bincount(documents.indices, minlength=self.width))])
        self.postings = _csr(indptr, document_of, documents.values[by_term], (self.width, self.size))

    def scores(self, queries: SparseVectors) -> np.ndarray:
        """(Q, N) each query vector's dot product with every document."""
        if queries.width != self.width:
            raise ValueError(f"queries of width {queries.width} against documents of width {self.width}")
        with _sparse_csr_quietly():
            return (queries.csr() @ self.postings).to_dense().numpy()

    def search(self, queries: SparseVectors, k: int) -> np.ndarray:
        """(Q, k) the best documents of each query, best first; a block of queries at a time, so that the scores held
        stay under SCORE_BLOCK floats."""
        k = min(k, self.size)
        if k == 0:
            return np.zeros((len(queries), 0), dtype=np.int64)
        block, rows = max(1, SCORE_BLOCK // self.size), [np.zeros((0, k), dtype=np.int64)]
        for q0 in range(0, len(queries), block):
            scores = self.scores(queries[q0 : q0 + block])  # (q, N)
            top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
            order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
            rows.append(np.take_along_axis(top, order, axis=1))
        return np.concatenate(rows)
