"""Pooling: token vectors -> one vector per sequence (sentence embeddings; the ONNX encoder graph pools inside)."""

from __future__ import annotations

import torch

from unmask.config import POOLING_MODES
from unmask.errors import UsageError


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, T, H) token vectors -> (B, H) sentence vectors, ignoring padding."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    if mode == "mean":
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return hidden.masked_fill(mask == 0, -1e9).max(1).values
    raise UsageError(f"pooling must be one of {POOLING_MODES}, got {mode!r}")
