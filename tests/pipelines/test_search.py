"""Exact search, block by block: the same ranking and scores as one full product."""

from __future__ import annotations

import numpy as np

from unmask.pipelines import search


def test_blockwise_search_is_the_full_ranking(monkeypatch):
    rng = np.random.default_rng(0)
    queries, docs = rng.normal(size=(30, 8)).astype(np.float32), rng.normal(size=(200, 8)).astype(np.float16)
    monkeypatch.setattr(search, "QUERY_BLOCK", 7)
    monkeypatch.setattr(search, "DOC_BLOCK", 13)
    ids, scores = search.exact_search(queries, docs, 25)
    full = queries @ docs.astype(np.float32).T
    assert np.array_equal(ids, np.argsort(-full, axis=1, kind="stable")[:, :25])
    assert np.allclose(scores, np.take_along_axis(full, ids, axis=1))
