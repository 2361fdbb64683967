"""Int8 dynamic quantisation for CPU inference (an opt-in mode: `--int8`).

Every `nn.Linear` keeps its weight as int8 (one scale per output channel) and quantises its input per call, so the
matrix products - nearly all of an encoder's FLOPs - run as int8 GEMMs, faster than fp32 ones on every CPU we measured
(BENCHMARKS.md). Embeddings, LayerNorm, attention scores and softmax stay fp32.
The cost is accuracy: BENCHMARKS.md reports the STS-B Spearman drop of all-MiniLM-L6-v2 (aim <= 0.005).

Where the CPU has AMX, the weights are packed for oneDNN's engine, whose int8 GEMMs use the AMX tiles; elsewhere for
torch's default engine (fbgemm). Each packed weight carries its engine, so the process-wide engine setting is
restored after packing. oneDNN builds a kernel per number of rows; `runtime.bound_kernel_caches` caps their caches.

Activations use all 8 bits where the CPU has AVX512-VNNI. torch's dynamic linear layer quantises them to 7 bits
(`reduce_range`): without VNNI, the int8 product sums pairs of u8 x s8 products in int16, which full-range values
can saturate; VNNI sums into int32, so the 8th bit is free there and halves the rounding error.

The quantised model is for inference only: it has no trainable linear weights and is never saved.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear
from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

from unmask.errors import UsageError


class FullRangeLinear(DynamicQuantizedLinear):
    """A dynamically quantised linear layer whose activations use the full u8 range (CPUs with VNNI)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self._packed_params._packed_params, reduce_range=False).to(x.dtype)


def packing_engine() -> str:
    """The quantised engine whose int8 GEMMs are fastest on this CPU: oneDNN's where it can use AMX tiles."""
    if torch.cpu._is_amx_tile_supported() and "onednn" in torch.backends.quantized.supported_engines:
        return "onednn"
    return torch.backends.quantized.engine


@contextmanager
def _quantized_engine(engine: str) -> Iterator[None]:
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace the model's linear layers, in place, by dynamically quantised int8 ones; returns the model in
    eval mode."""
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise UsageError("int8 dynamic quantisation runs on CPU only; load the model on CPU (or drop --int8)")
    if any(p.dtype != torch.float32 for p in model.parameters()):
        raise UsageError("int8 quantisation starts from float32 weights; do not combine it with a bf16 model")
    with warnings.catch_warnings(), _quantized_engine(packing_engine()):
        # torch marks its quantised tensor types as deprecated (in favour of torchao, a dependency we do not
        # take); they still work in the pinned torch and are the only int8 GEMM path in it for CPU
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        layer = FullRangeLinear if torch.cpu._is_vnni_supported() else DynamicQuantizedLinear
        return quantize_dynamic(model.eval(), {nn.Linear: per_channel_dynamic_qconfig}, inplace=True,
                                mapping={nn.Linear: layer})
