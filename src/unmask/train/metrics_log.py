"""What a run leaves to read: `metrics.jsonl` (one JSON object per logged step or evaluation) and `loss_curve.png`."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from unmask.errors import CheckpointError
from unmask.io import atomic_write, atomic_write_text


def read_rows(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl. A torn last line (a run killed mid-write) is dropped with a warning; a damaged
    line before it is an error naming the file and line."""
    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines):
                warnings.warn(f"{path}:{number}: a torn last line (the run was killed mid-write), dropped",
                              stacklevel=2)
                break
            raise CheckpointError(f"{path}:{number}: not a JSON line ({e.msg}); remove the line to continue") from e
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise CheckpointError(f"{path}:{number}: not a metrics row (an object with a step)")
        rows.append(row)
    return rows


class MetricsLog:
    """metrics.jsonl, one JSON object per line; a resumed run drops the lines written after its checkpoint.
    Only the main rank writes (`enabled`)."""

    def __init__(self, path: Path, resume_step: int | None, enabled: bool):
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        if resume_step is None:
            path.unlink(missing_ok=True)
        elif path.exists():
            kept = [row for row in read_rows(path) if row["step"] <= resume_step]
            atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in kept))

    def write(self, row: dict) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")

    def rows(self) -> list[dict]:
        return read_rows(self.path) if self.path.exists() else []


def plot_loss_curve(metrics_file: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_rows(metrics_file)
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    evals = [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="train loss")
    if evals:
        ax.plot(*zip(*evals), "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_write(png, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
