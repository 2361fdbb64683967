"""Losses for bi-encoders (sentence embeddings), on the pooled vectors of two batches of texts.

MultipleNegativesRankingLoss (in-batch negatives): text a_i should be nearest b_i among all b_j of the batch.
CoSENT: for scored pairs, every pair with a higher gold score should get a higher cosine than every pair below it.
Both use scaled cosine similarity (scale 20, as sentence-transformers does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def in_batch_negatives_loss(a: torch.Tensor, b: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """(B, H), (B, H) -> cross-entropy of each a_i over the B candidates b_j, the right one being b_i."""
    scores = F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T * scale  # (B, B)
    return F.cross_entropy(scores.float(), torch.arange(len(a), device=a.device))


def cosent_loss(a: torch.Tensor, b: torch.Tensor, labels: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """log(1 + sum over pairs (i, j) with label_i > label_j of exp(s_j - s_i)), s the scaled cosines."""
    s = F.cosine_similarity(a, b, dim=-1).float() * scale  # (B,)
    diff = s[None, :] - s[:, None]  # (B, B): s_j - s_i
    ordered = labels[:, None] > labels[None, :]  # i should beat j
    diff = diff[ordered]
    return torch.logsumexp(torch.cat([diff.new_zeros(1), diff]), dim=0)
