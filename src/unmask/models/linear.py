"""`Linear`: `nn.Linear` (the same parameters, state dict, initialisation and training) whose fp32 inference on a CPU
that is not Intel's runs oneDNN's matrix product instead of MKL's.

Why: MKL, torch's fp32 GEMM on the CPU, runs its AVX2 kernels on other vendors' CPUs; oneDNN builds kernels for the
CPU it finds (AVX512 on an AMD EPYC), and there ran an encoder's products 1.2-1.45x faster, as fast as ONNX
Runtime's (BENCHMARKS.md). oneDNN builds a kernel per shape (~0.6 ms, kept in a cache), so the rows are rounded up
to one of 8 sizes per octave (zero rows, at most 1/8 more): batches whose token counts differ every time reuse a
few dozen kernels instead of building one each. With autograd on (training, an ONNX trace), `F.linear` runs: the
oneDNN op has no backward.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F


@functools.cache
def onednn_is_faster() -> bool:
    """A CPU whose vendor is not Intel (MKL's own kernels there are AVX2), with oneDNN in this torch build."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            vendor = next((line.split(":")[1].strip() for line in f if line.startswith("vendor_id")), "")
    except OSError:
        return False
    return vendor not in ("", "GenuineIntel") and torch.backends.mkldnn.is_available()


def bucket_rows(rows: int) -> int:
    """`rows` rounded up to one of 8 sizes per octave (exact below 16)."""
    step = 1 << max(0, rows.bit_length() - 4)
    return -(-rows // step) * step


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.float32
                or torch.jit.is_tracing() or not onednn_is_faster()):
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // x.shape[-1]
        flat = x.reshape(rows, x.shape[-1])  # (M, K)
        bucket = bucket_rows(rows)
        padded = F.pad(flat, (0, 0, 0, bucket - rows)) if bucket > rows else flat  # (M', K)
        out = torch.ops.mkldnn._linear_pointwise(padded, self.weight, self.bias, "none", [], "")  # (M', N)
        return out[:rows].view(*x.shape[:-1], out.shape[-1])
