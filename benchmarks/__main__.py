"""Run the performance benchmarks one after another and chart ours / reference ratios.

    python -m benchmarks [--out benchmark-results] [--quick]

Each benchmark runs as its own process (`python -m benchmarks.NAME --output DIR/NAME.json`); the chart
`DIR/ratios.png` shows every ours / reference ratio (higher is better for us; 1 = parity); `--chart_only` redraws
it from the JSON files already there. `--quick` shrinks every benchmark to a smoke run (shapes and plumbing, not
numbers).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

RUNS = {
    "collate": ([], ["--batches", "2", "--rounds", "1"]),
    "throughput": ([], ["--configs", "bert-tiny", "--steps", "1", "--rounds", "1"]),
    "scaling": (["--scaling"], ["--scaling", "--lengths", "128", "256", "--steps", "1"]),
    "inference": ([], ["--sentences", "32", "--rounds", "1"]),
    "serve_load": ([], ["--clients", "4", "--requests", "2"]),
}
MODULES = {"scaling": "throughput"}


def ratios(out: Path) -> dict[str, float]:
    """'what: ratio' for everything measured, from the JSON files."""
    found = {}
    if (out / "collate.json").exists():
        for kind, value in json.loads((out / "collate.json").read_text())["ratio"].items():
            found[f"collator, {kind}"] = value
    if (out / "throughput.json").exists():
        for name, row in json.loads((out / "throughput.json").read_text())["results"].items():
            found[f"pretraining {name}"] = row["ratio"]
    if (out / "inference.json").exists():
        data = json.loads((out / "inference.json").read_text())
        found["embeddings MiniLM fp32"] = data["embeddings"]["ratio"]
        if "ratio_int8" in data["embeddings"]:
            found["embeddings MiniLM --int8"] = data["embeddings"]["ratio_int8"]
        if "ratio_bf16" in data["embeddings"]:
            found["embeddings MiniLM bf16"] = data["embeddings"]["ratio_bf16"]
        found["fill-mask batch 1"] = data["fill-mask"]["batch 1"]["ratio"]
        found["fill-mask batch 32"] = data["fill-mask"]["batch 32"]["ratio"]
        for precision, row in data["latency bert-base 128 tokens"].items():
            found[f"bert-base latency (1 x 128) {precision}"] = row["ratio"]
        if "modernbert-small ragged batch" in data:
            found["ModernBERT ragged batch (16 x 64-511)"] = data["modernbert-small ragged batch"]["ratio"]
        found["tokenization"] = data["tokenization"]["ratio"]
    return found  # serve_load compares our batching with our one-request passes: its table, not this chart


def chart(found: dict[str, float], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(found)
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(names) + 1.2))
    colours = ["tab:green" if found[n] >= 1 else "tab:red" for n in names]
    ax.barh(names, [found[n] for n in names], color=colours)
    ax.axvline(1.0, color="black", linewidth=1)
    for i, n in enumerate(names):
        ax.text(found[n], i, f" {found[n]:.2f}x", va="center")
    ax.set_xlim(0, max(found.values()) * 1.15)  # room for the labels
    ax.invert_yaxis()
    ax.set_xlabel("ours / reference (higher is better; 1 = parity)")
    fig.suptitle("unmask / (sentence-)transformers, same machine, same run")  # centred on the figure, not the bars
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmark-results")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", choices=list(RUNS), default=list(RUNS))
    parser.add_argument("--chart_only", action="store_true", help="redraw the chart from the JSON already in --out")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in [] if args.chart_only else args.only:
        full, quick = RUNS[name]
        command = [sys.executable, "-m", f"benchmarks.{MODULES.get(name, name)}", *(quick if args.quick else full),
                   "--output", str(out / f"{name}.json")]
        print(f"\n== {' '.join(command[1:])}", flush=True)
        subprocess.run(command, check=True)
    found = ratios(out)
    chart(found, out / "ratios.png")
    print("\n" + "\n".join(f"{k:<40} {v:6.2f}x" for k, v in found.items()))
    print(f"chart: {out / 'ratios.png'}")


if __name__ == "__main__":
    main()
