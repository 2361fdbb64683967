"""BM25, the lexical baseline of `eval retrieval --bm25`, with Lucene's scoring and BEIR's parameters (k1 0.9, b 0.4):

    score(q, d) = sum over the query's words t of idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl)),
    idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)).

Words are lowercased `\\w+` runs without Lucene's English stop words; there is no stemming (Pyserini's BEIR runs use
Porter's), so scores sit a little below published BM25 figures. An inverted index: each query touches only the
postings of its words.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

from unmask.pipelines.search import InvertedIndex, SparseVectors

WORD = re.compile(r"\w+")
STOP_WORDS = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their then "
                       "there these they this to was will with".split())  # Lucene's EnglishAnalyzer default set


def analyze(text: str) -> list[str]:
    return [word for word in WORD.findall(text.lower()) if word not in STOP_WORDS]


class BM25:
    def __init__(self, documents: list[str], k1: float = 0.9, b: float = 0.4):
        counts = [Counter(analyze(text)) for text in documents]
        lengths = np.array([sum(c.values()) for c in counts], dtype=np.float32)
        document_frequency = Counter(word for c in counts for word in c)
        self.vocabulary = {word: i for i, word in enumerate(document_frequency)}
        n, average = len(documents), max(float(lengths.mean()) if len(documents) else 0.0, 1e-9)
        idf = np.array([math.log(1 + (n - df + 0.5) / (df + 0.5)) for df in document_frequency.values()])
        norm = k1 * (1 - b + b * lengths / average)  # (N,) each document's length term
        rows = []
        for doc, c in enumerate(counts):
            ids, tf = self._term_counts(c)
            rows.append((ids, idf[ids] * tf / (tf + norm[doc])))
        self.index = InvertedIndex(SparseVectors.from_rows(rows, len(self.vocabulary)))

    def _term_counts(self, counts: Counter) -> tuple[np.ndarray, np.ndarray]:
        """(known words' ids ascending, their counts)."""
        pairs = sorted((self.vocabulary[word], n) for word, n in counts.items() if word in self.vocabulary)
        return np.array([i for i, _ in pairs], dtype=np.int32), np.array([n for _, n in pairs], dtype=np.float32)

    def _queries(self, queries: list[str]) -> SparseVectors:
        """Each query's word counts (a repeated query word counts each time, as in Lucene)."""
        return SparseVectors.from_rows([self._term_counts(Counter(analyze(q))) for q in queries], len(self.vocabulary))

    def scores(self, query: str) -> np.ndarray:
        """(N,) the query's score for every document."""
        return self.index.scores(self._queries([query]))[0]

    def search(self, queries: list[str], k: int) -> np.ndarray:
        """(Q, k) the best documents of each query, best first."""
        return self.index.search(self._queries(queries), k)
