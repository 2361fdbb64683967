"""Process-wide settings, applied once by the entry points (`unmask` commands, benchmarks), never by a library call.

`keep_freed_memory`: keep freed memory in the process instead of handing it back to the kernel after every step.

glibc serves allocations above 32 MB (the word-embedding gradient of a BERT vocabulary is larger) with a fresh mmap
and unmaps them when freed, so every training step page-faults them in again and zero-fills them, which on the
sandboxed CPU machines we measure on costs more than the computation of some layers (BENCHMARKS.md). Raising glibc's
mmap and trim thresholds once per process keeps such blocks in the heap for reuse, until the process exits (as
PyTorch's CUDA allocator keeps its blocks). The price is resident memory: freed blocks stay resident and the heap
fragments around them, so a training step's peak RSS is higher than under glibc's defaults (BENCHMARKS.md, issue
26). Inference gains too: it allocates the same large activations forward after forward. The `unmask` command
applies it at start-up; a Python program calls `keep_freed_memory()` once itself.

`bound_kernel_caches`: oneDNN (bf16 matmuls on CPU, int8 ones on AMX CPUs) builds a kernel per input shape and keeps
it in two caches of 1,024 entries each (oneDNN's own and ideep's), about a megabyte a kernel. Unpadded batches have a
new number of tokens nearly every time, so a server or a training run in bf16 or int8 grew by hundreds of MB over a
thousand batches. Capping both caches keeps the process flat; a shape used again (a fixed-size loop) stays cached.
`unmask` applies it with `--bf16` or `--int8` (fp32 matmuls are not oneDNN's), before torch is imported; a user's own
setting of either variable wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h
_done = False
KERNEL_CACHE_CAPACITY = 64


def keep_freed_memory() -> bool:
    """Tune glibc's allocator for large, repeated tensor allocations; True when applied (Linux with glibc only)."""
    global _done
    if _done or not sys.platform.startswith("linux"):
        return _done
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc: nothing to tune
        return False
    _done = bool(mallopt(_M_MMAP_THRESHOLD, 1 << 30)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 31))
    return _done



def bound_kernel_caches(capacity: int = KERNEL_CACHE_CAPACITY) -> None:
    """Cap oneDNN's and ideep's per-shape kernel caches (before torch is imported), unless the user set them."""
    for variable in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(variable, str(capacity))
