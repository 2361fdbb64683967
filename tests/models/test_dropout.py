"""Our CPU dropout: F.dropout's distribution and scaling from a cheaper mask."""

from __future__ import annotations

import pytest
import torch

from unmask.models.dropout import Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drops_a_fraction_p_and_scales_the_rest(p):
    torch.manual_seed(0)
    x = torch.rand(2048, 1024) + 0.5  # no zeros of its own
    y = dropout(x, p)
    dropped = (y == 0).float().mean().item()
    # 2M Bernoulli draws: the standard error of the fraction is <= 0.00035
    assert abs(dropped - p) < 0.002
    kept = y != 0
    assert torch.allclose(y[kept], x[kept] / (1 - p))
    # rows and columns are dropped alike (no pattern from the four-elements-per-draw layout)
    assert (y == 0).float().mean(0).sub(p).abs().max() < 0.1
    lanes = [(y[:, lane::4] == 0).float().mean().item() for lane in range(4)]  # the four 16-bit draws of a word
    assert max(lanes) - min(lanes) < 0.004


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(1)
    x = torch.randn(63, 33, requires_grad=True)  # 2,079 elements: the last 64-bit draw serves three
    y = dropout(x, 0.25)
    y.sum().backward()
    expected = (y != 0).float() / 0.75
    assert torch.equal(x.grad, expected)


def test_bf16_keeps_its_mask_in_bf16_and_scales_exactly():
    """Under bf16 the mask is a bf16 tensor of ones and zeros (no conversions), the scale is applied once, as in
    F.dropout: kept values equal x / (1 - p) rounded to bf16, and the gradient is the mask times the scale."""
    torch.manual_seed(2)
    x = (torch.rand(512, 256) + 0.5).to(torch.bfloat16).requires_grad_()
    y = dropout(x, 0.1)
    assert y.dtype == torch.bfloat16 and abs((y == 0).float().mean().item() - 0.1) < 0.005
    kept = y != 0
    assert torch.equal(y[kept], (x.detach()[kept].float() * (1 / 0.9)).to(torch.bfloat16))
    y.float().sum().backward()
    assert torch.equal(x.grad, kept.to(torch.bfloat16) * torch.tensor(1 / 0.9, dtype=torch.bfloat16))


def test_seeded_eval_and_edge_cases():
    x = torch.randn(300, 7, dtype=torch.bfloat16)
    torch.manual_seed(5)
    a = dropout(x, 0.1)
    torch.manual_seed(5)
    b = dropout(x, 0.1)
    assert torch.equal(a, b) and a.dtype == torch.bfloat16  # the global seed fixes the mask
    assert dropout(x, 0.1, training=False) is x and dropout(x, 0.0) is x
    assert torch.count_nonzero(dropout(x, 1.0)) == 0
    module = Dropout(0.1)
    assert torch.equal(module.eval()(x), x)
    assert module.train()(x).shape == x.shape and repr(module) == "Dropout(p=0.1, inplace=False)"


def test_attention_with_dropout_is_sdpa_with_that_mask(monkeypatch):
    """The written-out CPU attention equals SDPA's math given the same dropout mask, padding and band included."""
    import torch.nn.functional as F

    from unmask.models import attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 10, 8) for _ in range(3))
    key_mask = torch.ones(2, 10, dtype=torch.bool)
    key_mask[1, 6:] = False
    mask = attention.padded_mask(key_mask, 10, 4, q.device)  # padding and a sliding window of 4
    keep = torch.rand(2, 3, 10, 10) >= 0.3
    monkeypatch.setattr(attention, "keep_mask", lambda x, p: keep)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    ours = attention.sdpa(q, k, v, mask, dropout_p=0.3)
    scores = (q @ k.transpose(-1, -2) / 8**0.5).masked_fill(~mask, float("-inf"))
    expected = (scores.softmax(-1) * keep / 0.7) @ v
    has_key = mask.expand(2, 3, 10, 10).any(-1)  # padding queries at the end of sequence 1 see no key at all
    assert not has_key.all() and torch.isfinite(ours).all()  # those rows are finite (and unused), not NaN
    assert (ours - expected)[has_key].abs().max() < 1e-5
    # the backward recomputes the probabilities instead of keeping them: autograd's gradients of the same math
    weights = torch.randn(ours.shape)
    finite = (q @ k.transpose(-1, -2) / 8**0.5).masked_fill(~mask, torch.finfo(q.dtype).min)  # no NaN rows
    expected = (finite.softmax(-1) * keep / 0.7) @ v
    grads = [torch.autograd.grad((out * weights)[has_key].sum(), (q, k, v)) for out in (ours, expected)]
    for mine, reference in zip(*grads):
        assert torch.allclose(mine, reference, atol=1e-5)
    monkeypatch.setattr(attention, "keep_mask", lambda x, p: torch.ones_like(x, dtype=torch.bool))  # keep all
    sdpa = F.scaled_dot_product_attention(q, k, v, mask) / 0.7  # ... and scale the kept by 1 / (1 - p)
    assert (attention.sdpa(q, k, v, mask, dropout_p=0.3) - sdpa)[has_key].abs().max() < 1e-5
