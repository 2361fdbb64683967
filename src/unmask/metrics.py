"""Every metric unmask reports, on plain numbers (numpy; no model here).

- Classification: accuracy and macro-F1.
- Regression and STS: Pearson, and Spearman with tied values given their average rank (as scipy).
- Tagging: entity-level precision / recall / F1, exactly as conlleval and `seqeval` (default mode) compute them.
  Chunks are read with conlleval's rules, which serve both tagging schemes: IOB2/BIO (every entity opens with B-)
  and IOB1 (I- everywhere, B- only between two adjacent entities of the same type). An I- tag after O or after
  another type opens a new entity; an entity counts as correct only if its type, start and end all match.
- Retrieval: nDCG@10 (graded gains, log2 discount), recall@100 and MRR@10, averaged over queries (as BEIR).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np


def macro_f1(gold: np.ndarray, predicted: np.ndarray, n_labels: int) -> float:
    f1s = []
    for label in range(n_labels):
        tp = int(((predicted == label) & (gold == label)).sum())
        fp = int(((predicted == label) & (gold != label)).sum())
        fn = int(((predicted != label) & (gold == label)).sum())
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return float(np.mean(f1s))


def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties get their average rank (as scipy.stats.rankdata)."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(1, len(x) + 1)
    sorted_x = x[order]
    # average the ranks of each run of equal values
    boundaries = np.flatnonzero(np.diff(sorted_x) != 0) + 1
    for run in np.split(np.arange(len(x)), boundaries):
        if len(run) > 1:
            ranks[order[run]] = ranks[order[run]].mean()
    return ranks


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64) - np.mean(a), np.asarray(b, np.float64) - np.mean(b)
    return float((a * b).sum() / math.sqrt((a * a).sum() * (b * b).sum()))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return pearson(rankdata(np.asarray(a, np.float64)), rankdata(np.asarray(b, np.float64)))


def retrieval_metrics(ranked: list[list[str]], query_ids: list[str], relevance: dict[str, dict[str, int]]) -> dict:
    """nDCG@10, recall@100 and MRR@10 of ranked document ids per query, averaged over queries."""
    ndcg, recall, mrr = [], [], []
    for qid, docs in zip(query_ids, ranked):
        rel = relevance[qid]
        dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(docs[:10]))
        ideal = sorted((g for g in rel.values() if g > 0), reverse=True)[:10]
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
        ndcg.append(dcg / idcg if idcg > 0 else 0.0)
        relevant = {d for d, g in rel.items() if g > 0}
        recall.append(len(relevant & set(docs[:100])) / len(relevant) if relevant else 0.0)
        mrr.append(next((1.0 / (i + 1) for i, d in enumerate(docs[:10]) if d in relevant), 0.0))
    return {"ndcg@10": float(np.mean(ndcg)), "recall@100": float(np.mean(recall)), "mrr@10": float(np.mean(mrr)),
            "queries": len(query_ids)}


# -- entity F1 --------------------------------------------------------------------------------------------------------

def _split(tag: str) -> tuple[str, str]:
    if tag in ("O", "", "."):
        return "O", ""
    prefix, _, kind = tag.partition("-")
    if prefix not in ("B", "I", "E", "S") or not kind:  # a bare type (no prefix) is treated as I-type
        return "I", tag
    return prefix, kind


def _ends(prev_tag: str, tag: str, prev_type: str, kind: str) -> bool:
    return (prev_tag in ("E", "S")
            or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
            or (prev_tag != "O" and prev_type != kind))


def _starts(prev_tag: str, tag: str, prev_type: str, kind: str) -> bool:
    return (tag in ("B", "S")
            or (prev_tag in ("E", "S", "O") and tag in ("E", "I"))
            or (tag != "O" and prev_type != kind))


def entities(tags: list[str]) -> list[tuple[str, int, int]]:
    """(type, first index, last index) of every entity in one sentence's tags."""
    found = []
    prev_tag, prev_type, begin = "O", "", 0
    for i, tag in enumerate([*tags, "O"]):  # the sentinel closes an entity that runs to the end
        prefix, kind = _split(tag)
        if _ends(prev_tag, prefix, prev_type, kind) and prev_tag != "O":
            found.append((prev_type, begin, i - 1))
        if _starts(prev_tag, prefix, prev_type, kind):
            begin = i
        prev_tag, prev_type = prefix, kind
    return found


def entity_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict:
    """Micro-averaged entity precision, recall and F1 over sentences, plus the same per entity type."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    true_n, pred_n, correct_n = Counter(), Counter(), Counter()
    for g, p in zip(gold, predicted):
        if len(g) != len(p):
            raise ValueError(f"a sentence has {len(g)} gold tags but {len(p)} predicted")
        gold_set, pred_set = set(entities(g)), set(entities(p))
        true_n.update(e[0] for e in gold_set)
        pred_n.update(e[0] for e in pred_set)
        correct_n.update(e[0] for e in gold_set & pred_set)

    def prf(correct: int, pred: int, true: int) -> dict:
        precision = correct / pred if pred else 0.0
        recall = correct / true if true else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {"precision": precision, "recall": recall, "f1": f1}

    scores = prf(sum(correct_n.values()), sum(pred_n.values()), sum(true_n.values()))
    scores["per_type"] = {t: {**prf(correct_n[t], pred_n[t], true_n[t]), "support": true_n[t]}
                          for t in sorted(set(true_n) | set(pred_n))}
    return scores
