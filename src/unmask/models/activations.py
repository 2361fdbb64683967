"""Activation functions by their HF `config.json` names, and in-place versions of the same.

The feed-forward's intermediate is a layer's largest activation. When autograd records nothing (inference, and
evaluation under `no_grad`), nothing will read it again, so `activate` overwrites it instead of allocating and
writing a second one; when autograd records, it must keep it for the backward and `activate` leaves it intact.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = {
    "gelu": F.gelu,  # exact (erf) GELU, as BERT and HF use
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}
ACTIVATIONS_IN_PLACE = {
    "gelu": torch.ops.aten.gelu_,
    "gelu_new": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "silu": lambda x: F.silu(x, inplace=True),
    "relu": F.relu_,
}


def activate(name: str, x: torch.Tensor) -> torch.Tensor:
    """`ACTIVATIONS[name](x)`, computed in place over `x` when no gradient is recorded (`x` is then consumed)."""
    return ACTIVATIONS[name](x) if torch.is_grad_enabled() else ACTIVATIONS_IN_PLACE[name](x)


def gated(name: str, value: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """GLU: `ACTIVATIONS[name](value) * gate`, written over `value` when no gradient is recorded."""
    if torch.is_grad_enabled():
        return ACTIVATIONS[name](value) * gate
    return ACTIVATIONS_IN_PLACE[name](value).mul_(gate)
