"""GELU over many token counts: `F.gelu` (oneDNN's kernel, built and cached per shape) against unmask's `gelu`
(ATen's kernel), forward and backward, each in its own process (oneDNN's cache is per process).

    python -m benchmarks.activation_memory [--shapes 300 --width 1024]

Unpadded batches have a new number of real tokens nearly every step, so each call here gets a random one in
[3,500, 4,096] (a bert-mini pretraining batch of 32 x 128). Prints the resident memory after the calls and the
mean time of one forward + backward, for fp32 and bf16.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time


def resident_mib() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1]) // 1024


def measure(kind: str, dtype: str, shapes: int, width: int) -> dict:
    import torch
    import torch.nn.functional as F

    from unmask.models.activations import gelu
    from unmask.runtime import keep_freed_memory

    keep_freed_memory()  # as `unmask` runs
    activation = F.gelu if kind == "F.gelu" else gelu
    rng, seconds = random.Random(0), 0.0
    for _ in range(shapes):
        x = torch.randn(rng.randint(3500, 4096), width, dtype=getattr(torch, dtype), requires_grad=True)
        started = time.perf_counter()
        activation(x).backward(torch.ones_like(x))
        seconds += time.perf_counter() - started
    return {"rss_mib": resident_mib(), "ms_per_call": round(seconds / shapes * 1000, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=int, default=300)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # internal: KIND DTYPE in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.shapes, args.width)))
        return
    for dtype in ("float32", "bfloat16"):
        for kind in ("F.gelu", "unmask gelu"):
            done = subprocess.run([sys.executable, "-m", "benchmarks.activation_memory", "--one", kind, dtype,
                                   "--shapes", str(args.shapes), "--width", str(args.width)],
                                  capture_output=True, text=True, check=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{dtype:<9} {kind:<12} RSS after {args.shapes} shapes {result['rss_mib']:>6,} MiB   "
                  f"{result['ms_per_call']:6.2f} ms per forward + backward", flush=True)


if __name__ == "__main__":
    main()
