"""Unpadding: keep only the real tokens of a right-padded batch, as one concatenated sequence, and put them back.

    indices    (N,)     flat positions of the real tokens in the (B * T) batch
    cu_seqlens (B + 1,) where each sequence starts in the concatenation (cumulative lengths, from 0)
    max_seqlen          the longest sequence
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def unpad_input(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(B, T) mask -> indices (N,), cu_seqlens (B + 1,) int32, max_seqlen."""
    lengths = attention_mask.sum(dim=1, dtype=torch.int32)  # (B,)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(lengths, dim=0, dtype=torch.int32), (1, 0))
    return indices, cu_seqlens, int(lengths.max()) if len(lengths) else 0


def pad_input(x: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """(N, ...) real-token rows -> (B, T, ...) with zeros at the padding."""
    out = x.new_zeros(batch * seqlen, *x.shape[1:])
    out[indices] = x
    return out.view(batch, seqlen, *x.shape[1:])


def positions_in_sequence(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """(N,) the position of each concatenated token inside its own sequence (what RoPE needs)."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    starts = torch.repeat_interleave(cu_seqlens[:-1].long(), lengths)
    return torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device) - starts


def padded_positions(cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    """(N,) where each concatenated token sits in a right-padded (B, max_seqlen) batch, flattened."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    sequence = torch.repeat_interleave(torch.arange(len(lengths), device=cu_seqlens.device), lengths)
    return sequence * max_seqlen + positions_in_sequence(cu_seqlens)
