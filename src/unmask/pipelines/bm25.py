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
from collections import Counter, defaultdict

import numpy as np

WORD = re.compile(r"\w+")
STOP_WORDS = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their then "
                       "there these they this to was will with".split())  # Lucene's EnglishAnalyzer default set


def analyze(text: str) -> list[str]:
    return [word for word in WORD.findall(text.lower()) if word not in STOP_WORDS]


class BM25:
    def __init__(self, documents: list[str], k1: float = 0.9, b: float = 0.4):
        postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        lengths = np.zeros(len(documents), dtype=np.float32)
        for doc, text in enumerate(documents):
            counts = Counter(analyze(text))
            lengths[doc] = sum(counts.values())
            for word, count in counts.items():
                postings[word].append((doc, count))
        n, average = len(documents), max(float(lengths.mean()) if len(documents) else 0.0, 1e-9)
        norm = k1 * (1 - b + b * lengths / average)  # (N,) each document's length term
        self.size = n
        self.postings = {}  # word -> (document ids, idf * tf / (tf + norm)), precomputed once
        for word, pairs in postings.items():
            ids = np.array([doc for doc, _ in pairs], dtype=np.int64)
            tf = np.array([count for _, count in pairs], dtype=np.float32)
            idf = math.log(1 + (n - len(pairs) + 0.5) / (len(pairs) + 0.5))
            self.postings[word] = (ids, idf * tf / (tf + norm[ids]))

    def scores(self, query: str) -> np.ndarray:
        """(N,) the query's score for every document (a repeated query word counts each time, as in Lucene)."""
        total = np.zeros(self.size, dtype=np.float32)
        for word in analyze(query):
            if word in self.postings:
                ids, weights = self.postings[word]
                total[ids] += weights
        return total

    def search(self, queries: list[str], k: int) -> np.ndarray:
        """(Q, k) the best documents of each query, best first."""
        k = min(k, self.size)
        out = np.zeros((len(queries), k), dtype=np.int64)
        for q, query in enumerate(queries):
            scores = self.scores(query)
            top = np.argpartition(-scores, k - 1)[:k]
            out[q] = top[np.argsort(-scores[top], kind="stable")]
        return out
