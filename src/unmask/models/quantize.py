"""Int8 dynamic quantisation for CPU inference (an opt-in mode: `--int8`).

Every `nn.Linear` keeps its weight as int8 (one scale per output channel) and quantises its input per call, so the
matrix products - nearly all of an encoder's FLOPs - run as int8 GEMMs (fbgemm / x86 engine), faster than fp32 ones
on every CPU we measured (BENCHMARKS.md). Embeddings, LayerNorm, attention scores and softmax stay fp32.
The cost is accuracy: BENCHMARKS.md reports the STS-B Spearman drop of all-MiniLM-L6-v2 (aim <= 0.005).

The quantised model is for inference only: it has no trainable linear weights and is never saved.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn
from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

from unmask.errors import UsageError


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace the model's linear layers, in place, by dynamically quantised int8 ones; returns the model in
    eval mode."""
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise UsageError("int8 dynamic quantisation runs on CPU only; load the model on CPU (or drop --int8)")
    if any(p.dtype != torch.float32 for p in model.parameters()):
        raise UsageError("int8 quantisation starts from float32 weights; do not combine it with a bf16 model")
    with warnings.catch_warnings():
        # torch marks its quantised tensor types as deprecated (in favour of torchao, a dependency we do not
        # take); they still work in the pinned torch and are the only int8 GEMM path in it for CPU
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return quantize_dynamic(model.eval(), {nn.Linear: per_channel_dynamic_qconfig}, inplace=True)
