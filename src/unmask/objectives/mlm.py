"""The masked-LM loss: cross-entropy over the labelled positions only (labels are -100 elsewhere)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from unmask.data.masking import IGNORE_INDEX


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over positions whose label is not -100.

    Args:
        logits: (..., V) scores, either for every position (B, T, V) or already gathered (N, V).
        labels: (...) original ids, -100 where the position is not predicted.
    """
    logits, labels = logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1)
    if not bool((labels != IGNORE_INDEX).any()):
        return logits.sum() * 0.0  # nothing labelled (a short batch): a zero that keeps the graph, not NaN
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)
