"""Unpadding: keep only the real tokens of a right-padded batch, as one concatenated sequence, and put them back.

`unpad_input` reads the mask once a forward; every layer then shares what it computed (`Unpadded`), so the
layers read no data-dependent size (what keeps `torch.compile`'s graph whole between the embeddings and the head).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class Unpadded(NamedTuple):
    indices: torch.Tensor  # (N,) flat positions of the real tokens in the (B * T) batch
    cu_seqlens: torch.Tensor  # (B + 1,) int32: where each sequence starts in the concatenation, from 0
    max_seqlen: int  # the longest sequence
    padded_positions: torch.Tensor | None  # (N,) where each token sits in a right-padded (B, max_seqlen) batch
    padded_real: torch.Tensor | None  # (B, max_seqlen) bool, True at real tokens; both None if none is padding


def unpad_input(attention_mask: torch.Tensor) -> Unpadded:
    """(B, T) mask, 1 = real token -> the real tokens' layout."""
    B = attention_mask.shape[0]
    lengths = attention_mask.sum(dim=1, dtype=torch.int32)  # (B,)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(lengths, dim=0, dtype=torch.int32), (1, 0))
    max_seqlen = int(lengths.max()) if B else 0
    if len(indices) == B * max_seqlen:  # every sequence has the longest length (packed pretraining)
        return Unpadded(indices, cu_seqlens, max_seqlen, None, None)
    positions = padded_positions(cu_seqlens, max_seqlen)
    real = torch.zeros(B * max_seqlen, dtype=torch.bool, device=attention_mask.device)
    return Unpadded(indices, cu_seqlens, max_seqlen, positions, real.index_fill_(0, positions, True).view(B, -1))


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
