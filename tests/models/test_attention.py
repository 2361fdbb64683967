"""attention.varlen: its CPU inference path (one SDPA call per sequence) against its padded path."""

from __future__ import annotations

import pytest
import torch

from unmask.models import attention
from unmask.models.padding import unpad_input


@pytest.mark.parametrize("window", [None, 8, 4])
def test_each_sequence_equals_one_padded_call(window):
    """Inference takes one call per sequence, training one padded call: the outputs agree at every real token,
    for global and sliding-window layers (window 4 at 20 tokens takes the blocked kernel), an all-padding row
    included."""
    torch.manual_seed(0)
    lengths = torch.tensor([20, 7, 0, 13, 1])
    mask = (torch.arange(20)[None] < lengths[:, None]).long()  # (5, 20)
    batch = unpad_input(mask)
    q, k, v = (torch.randn(int(lengths.sum()), 3, 8) for _ in range(3))  # (N, nh, hd)
    with torch.no_grad():
        each = attention.varlen(q, k, v, batch, window)
    with torch.enable_grad():
        padded = attention.varlen(q, k, v, batch, window)
    assert each.shape == padded.shape == q.shape
    assert (each - padded).abs().max() < 1e-6
    # and each sequence is attention over itself alone
    first = torch.nn.functional.scaled_dot_product_attention(*(t[:20].transpose(0, 1) for t in (q, k, v)),
                                                             attn_mask=attention.band_mask(20, window, "cpu"))
    assert (each[:20] - first.transpose(0, 1)).abs().max() < 1e-6
