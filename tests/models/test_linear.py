"""`Linear`: nn.Linear's parameters and gradients; its oneDNN inference path (forced on here, whatever the CPU's
vendor) gives F.linear's output to fp32 rounding for any number of rows, with few distinct row counts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import unmask.models.linear as linear
from unmask.models.linear import Linear, bucket_rows


@pytest.fixture
def onednn(monkeypatch):
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    monkeypatch.setattr(linear, "onednn_is_faster", lambda: True)


@pytest.mark.parametrize("shape", [(1, 7), (3, 17), (1, 128), (2, 300), (1100,)])
def test_inference_equals_f_linear(onednn, shape):
    torch.manual_seed(0)
    layer = Linear(48, 80)
    x = torch.randn(*shape, 48)
    with torch.inference_mode():
        out = layer(x)
    assert out.shape == (*shape, 80) and out.is_contiguous()
    assert torch.allclose(out, F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)


def test_training_takes_f_linear_with_its_gradients(onednn):
    torch.manual_seed(0)
    layer = Linear(16, 8)
    reference = torch.nn.Linear(16, 8)
    reference.load_state_dict(layer.state_dict(), strict=True)
    x = torch.randn(5, 16)
    layer(x).square().sum().backward()
    reference(x).square().sum().backward()
    assert isinstance(layer, torch.nn.Linear) and list(layer.state_dict()) == ["weight", "bias"]
    assert torch.equal(layer.weight.grad, reference.weight.grad) and torch.equal(layer.bias.grad, reference.bias.grad)


def test_rows_take_at_most_8_sizes_an_octave_and_an_eighth_more():
    for octave in range(4, 15):
        sizes = {bucket_rows(rows) for rows in range(1 << octave, 1 << (octave + 1))}
        assert len(sizes - {1 << (octave + 1)}) == 8  # the last rows round up to the next octave's first size
    assert all(rows <= bucket_rows(rows) <= rows * 9 / 8 for rows in range(1, 20000))
    assert [bucket_rows(r) for r in (1, 15, 16, 17, 128, 129)] == [1, 15, 16, 18, 128, 144]
