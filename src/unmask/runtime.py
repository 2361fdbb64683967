"""A process-wide setting, applied once by the entry points (`unmask` commands, benchmarks), never by a library call:
keep freed memory in the process instead of handing it back to the kernel after every step.

glibc serves allocations above 32 MB (the word-embedding gradient of a BERT vocabulary is larger) with a fresh mmap
and unmaps them when freed, so every training step page-faults them in again and zero-fills them, which on the
sandboxed CPU machines we measure on costs more than the computation of some layers (BENCHMARKS.md). Raising glibc's
mmap and trim thresholds once per process keeps such blocks in the heap for reuse. Peak memory is unchanged; the
process simply keeps it until it exits (as PyTorch's CUDA allocator does). Inference gains too: it allocates the
same large activations forward after forward (BENCHMARKS.md). The `unmask` command applies it at start-up; a Python
program calls `keep_freed_memory()` once itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h
_done = False


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

