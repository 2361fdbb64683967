"""Rotary position embeddings (Su et al., 2021), NeoX layout: the head dimension is split in two halves that rotate
as (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). Stateless; the model keeps only `inv_freq` (non-persistent)."""

from __future__ import annotations

import torch


def inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """(head_dim / 2,) rotation speeds theta^(-2i / head_dim)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (...,) -> cos, sin (..., head_dim), in float32."""
    angles = positions.float()[..., None] * inv_freq.to(positions.device)  # (..., hd/2)
    angles = torch.cat([angles, angles], dim=-1)  # (..., hd)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate q or k; `cos`/`sin` broadcast against x's (..., T, hd). Computed in float32, returned in x's dtype."""
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).to(x.dtype)
