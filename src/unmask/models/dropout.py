"""Dropout with a cheaper random mask on the CPU; `Dropout` is `nn.Dropout` (same name, same `p`) calling it.

Why: on the CPU, `F.dropout` draws its mask with `bernoulli_`, one float draw per element, on one thread, and in a
bf16 training step that was a large share of the time (BENCHMARKS.md). Here one 64-bit draw serves four elements,
each dropped when its 16-bit quarter falls under the threshold: the drop probability is p to within 2^-17
(FlashAttention's GPU kernels round it to 2^-8), and the survivors are scaled by exactly 1 / (1 - p). On GPUs
`F.dropout` is fused and counter-based already, so it is used there. The mask is a different random stream from
`F.dropout`'s, from the same global generator (`torch.manual_seed` still fixes it).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Zero each element with probability `p` and scale the rest by 1 / (1 - p), as `F.dropout`."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, True)
    return (x * keep_mask(x, p)).mul_(1.0 / (1.0 - p))


def keep_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    """The CPU mask of `dropout` (1 = keep) for a tensor like `x`, drawn from the global generator."""
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # full 64-bit range
    draws = bits.view(torch.int16)[:n].view(x.shape)  # four uniform int16 draws per 64 bits
    threshold = min(round(p * 2**16), 2**16 - 1)  # within int16 after the shift below
    # the mask (1 = keep) in x's dtype when that takes 2 bytes (bf16 autocast): the two multiplies then convert
    # nothing, for 1 byte more an element kept for the backward; in fp32 one byte, uint8 rather than bool: a float
    # tensor multiplied by a bool one converts it first, slower than by a uint8 one (BENCHMARKS.md), and an fp32
    # mask would keep 3 bytes an element more for the backward
    keep = torch.empty_like(x, dtype=x.dtype if x.element_size() == 2 else torch.uint8)
    torch.ge(draws, -(2**15) + threshold, out=keep)
    return keep


class Dropout(nn.Dropout):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
