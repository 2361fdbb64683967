"""Entity-level precision / recall / F1, exactly as conlleval and `seqeval` (default mode) compute them.

Chunks are read with conlleval's rules, which serve both tagging schemes: IOB2/BIO (every entity opens with B-) and
IOB1 (I- everywhere, B- only between two adjacent entities of the same type). An I- tag after O or after another
type opens a new entity; an entity counts as correct only if its type, start and end all match.
"""

from __future__ import annotations

from collections import Counter


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
