"""Activation functions by their HF `config.json` names, and in-place versions of the same.

The feed-forward's intermediate is a layer's largest activation. When autograd records nothing (inference, and
evaluation under `no_grad`), nothing will read it again, so `activate` overwrites it instead of allocating and
writing a second one; when autograd records, it must keep it for the backward and `activate` leaves it intact.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU, as BERT and HF use, computed by ATen's kernel over a transposed view.

    Why the view: for a contiguous float tensor on the CPU, `F.gelu` calls oneDNN, which builds a kernel for each
    shape and caches it (~2 MB each). Unpadded batches have a new number of tokens almost every step, so memory
    grows by the step (training) and by the request (serving). ATen's kernel, which non-contiguous input gets, is
    as fast and keeps nothing (BENCHMARKS.md); the output comes back in the input's layout. An ONNX trace takes the
    plain call: the transposes would reach the graph, where ORT's quantiser skips a product of a transposed input."""
    if x.dim() < 2 or torch.jit.is_tracing():
        return F.gelu(x)
    return F.gelu(x.transpose(-2, -1)).transpose(-2, -1)


def gelu_(x: torch.Tensor) -> torch.Tensor:
    torch.ops.aten.gelu_(x.transpose(-2, -1) if x.dim() > 1 else x)
    return x


ACTIVATIONS = {
    "gelu": gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}
ACTIVATIONS_IN_PLACE = {
    "gelu": gelu_,
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
