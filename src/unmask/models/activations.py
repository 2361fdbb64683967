"""Activation functions by their HF `config.json` names, and in-place versions of the same for inference.

The in-place ones overwrite their input: the feed-forward's intermediate is a layer's largest activation, and when
no gradient is recorded there is no reason to allocate and write a second one.
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
