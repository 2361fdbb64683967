"""BM25: the inverted index gives Lucene's formula (k1 0.9, b 0.4) for every document, computed here the direct way."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from unmask.pipelines.bm25 import BM25, analyze

DOCS = ["The cat sat on the mat.", "A dog chased the cat, and the cat ran.", "Stock markets fell sharply.",
        "Cats and dogs: a study of cat behaviour in 2024", ""]


def direct(query: str, docs: list[str], k1: float = 0.9, b: float = 0.4) -> list[float]:
    words = [analyze(d) for d in docs]
    average = sum(map(len, words)) / len(words)
    out = []
    for doc in words:
        score = 0.0
        for term in analyze(query):
            df = sum(term in w for w in words)
            if df:
                tf = doc.count(term)
                score += math.log(1 + (len(docs) - df + 0.5) / (df + 0.5)) * tf / (
                    tf + k1 * (1 - b + b * len(doc) / average))
        out.append(score)
    return out


@pytest.mark.parametrize("query", ["cat", "the CAT ran", "dog markets 2024", "unknown words only", "cat cat"])
def test_scores_are_lucenes_formula(query):
    assert np.allclose(BM25(DOCS).scores(query), direct(query, DOCS), atol=1e-6)


def test_search_ranks_by_score_and_ignores_stop_words():
    assert analyze("The Cat, and THE dog!") == ["cat", "dog"]
    top = BM25(DOCS).search(["cat ran", "stock"], k=3)
    assert top[0, 0] == 1 and top[1, 0] == 2 and top.shape == (2, 3)


def test_eval_retrieval_bm25_needs_no_model(tmp_path):
    from unmask.example_data import write_example_data

    write_example_data(tmp_path)
    beir = ["--corpus", str(tmp_path / "scifact" / "corpus.jsonl"), "--queries",
            str(tmp_path / "scifact" / "queries.train.jsonl"), "--qrels", str(tmp_path / "scifact/qrels/train.tsv")]
    command = [sys.executable, "-m", "unmask.cli", "eval", "retrieval", "--bm25", *beir]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("ndcg@10 0.9") and "queries 67" in done.stdout
    done = subprocess.run(command + ["--model", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--bm25 scores without a model" in done.stderr
