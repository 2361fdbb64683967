"""The metrics: entity extraction and F1 on hand-made cases and against the seqeval package on random tag sequences;
ranks and correlations against scipy; retrieval metrics by hand."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from unmask.metrics import (
    entities,
    entity_scores,
    pearson,
    rankdata,
    retrieval_metrics,
    spearman,
)


def test_bio_entities():
    assert entities(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
    assert entities(["B-PER", "B-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
    assert entities(["O", "O"]) == []


def test_iob1_and_improper_sequences_follow_conlleval():
    assert entities(["I-PER", "I-PER", "B-PER", "O"]) == [("PER", 0, 1), ("PER", 2, 2)]  # IOB1
    assert entities(["O", "I-LOC", "I-LOC"]) == [("LOC", 1, 2)]  # I- after O opens an entity
    assert entities(["B-PER", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 1)]  # a type change closes one


def test_scores_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    predicted = [["B-PER", "I-PER", "O", "O"], ["B-ORG", "B-MISC"]]
    s = entity_scores(gold, predicted)
    # gold: PER, LOC, ORG (3); predicted: PER, ORG, MISC (3); correct: PER, ORG (2)
    assert math.isclose(s["precision"], 2 / 3) and math.isclose(s["recall"], 2 / 3) and math.isclose(s["f1"], 2 / 3)
    assert s["per_type"]["LOC"]["recall"] == 0.0 and s["per_type"]["PER"]["f1"] == 1.0
    with pytest.raises(ValueError, match="gold tags but"):
        entity_scores([["O"]], [["O", "O"]])


def test_agrees_with_seqeval_on_random_sequences():
    metrics = pytest.importorskip("seqeval.metrics")
    rng = random.Random(0)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
    for _ in range(20):
        gold = [[rng.choice(tags) for _ in range(rng.randint(1, 15))] for _ in range(50)]
        predicted = [[t if rng.random() < 0.7 else rng.choice(tags) for t in sentence] for sentence in gold]
        ours = entity_scores(gold, predicted)
        assert math.isclose(ours["f1"], metrics.f1_score(gold, predicted), abs_tol=1e-12)
        assert math.isclose(ours["precision"], metrics.precision_score(gold, predicted), abs_tol=1e-12)
        assert math.isclose(ours["recall"], metrics.recall_score(gold, predicted), abs_tol=1e-12)


def test_rank_and_correlations():
    assert rankdata(np.array([10.0, 20.0, 10.0, 30.0])).tolist() == [1.5, 3.0, 1.5, 4.0]
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert math.isclose(spearman(x, x ** 3), 1.0) and math.isclose(pearson(x, 2 * x + 1), 1.0)
    assert math.isclose(spearman(x, -x), -1.0)
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 6, 300).astype(float), rng.normal(size=300)  # many ties in a
    assert math.isclose(spearman(a, b), scipy_stats.spearmanr(a, b).statistic, abs_tol=1e-12)
    assert math.isclose(pearson(a, b), scipy_stats.pearsonr(a, b).statistic, abs_tol=1e-12)


def test_retrieval_metrics_by_hand():
    relevance = {"q1": {"d1": 1, "d3": 2}, "q2": {"d4": 1}}
    ranked = [["d2", "d3", "d1"], ["d1", "d2", "d3"]]
    m = retrieval_metrics(ranked, ["q1", "q2"], relevance)
    ndcg_q1 = (2 / math.log2(3) + 1 / math.log2(4)) / (2 + 1 / math.log2(3))
    assert math.isclose(m["ndcg@10"], ndcg_q1 / 2) and math.isclose(m["mrr@10"], 0.25)
    assert math.isclose(m["recall@100"], 0.5) and m["queries"] == 2
