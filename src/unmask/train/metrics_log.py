"""What a run leaves to read: `metrics.jsonl` (one JSON object per logged step or evaluation) and `loss_curve.png`."""

from __future__ import annotations

import json
from pathlib import Path

from unmask.io import atomic_write, atomic_write_text


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
            kept = [l for l in path.read_text().splitlines() if l and json.loads(l)["step"] <= resume_step]
            atomic_write_text(path, "".join(line + "\n" for line in kept))

    def write(self, row: dict) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")

    def rows(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


def plot_loss_curve(metrics_file: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
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
