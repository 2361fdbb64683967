"""ModernBERT at long context: forward time and peak memory at 512, 2048 and 8192 tokens.

    python -m benchmarks.long_context [--config modernbert-mini --lengths 512 2048 8192 --png long_context.png]

Each (length, attention layout) runs in a fresh process so its peak resident memory is its own. Three layouts of
the same model: ModernBERT's alternating local (128-token window) / global layers, every layer global (what a plain
encoder does), and every layer local. The local layers' cost grows linearly with length; global layers grow
quadratically, so the alternating model sits between the two curves. Prints a table and draws the curves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import PeakMemory

LAYOUTS = {"alternating (ModernBERT)": "alternating", "all global": "global", "all local": "local"}


def layout_overrides(layout: str, num_hidden_layers: int) -> dict:
    """Config overrides for a layout. 'all local' lists layer_types: under global_attn_every_n_layers alone, layer 0
    is always global."""
    if layout == "global":
        return {"global_attn_every_n_layers": 1}
    if layout == "local":
        return {"layer_types": ["sliding_attention"] * num_hidden_layers}
    return {}


def measure(config_name: str, length: int, layout: str, backend: str, repeats: int) -> dict:
    import torch

    from unmask.config import load_config
    from unmask.models.modernbert import ModernBertModel

    torch.manual_seed(0)
    context = max(length, 512)
    layers = load_config(config_name).num_hidden_layers
    config = load_config(config_name, max_position_embeddings=context, **layout_overrides(layout, layers))
    model = ModernBertModel(config).eval()
    model.attn_backend = backend
    ids = torch.randint(5, config.vocab_size, (1, length))
    times, added = [], []
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first run warms up
            with PeakMemory() as peak:
                start = time.perf_counter()
                model(ids)
                times.append(time.perf_counter() - start)
            added.append(peak.added_mib)
    return {"seconds": statistics.median(times[1:]), "peak_mib": peak.peak_mib,
            "activation_mib": statistics.median(added[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="modernbert-mini")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--backend", default="sdpa", choices=["sdpa", "varlen"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--png", default=None)
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # internal: length, layout
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.config, int(args.one[0]), args.one[1], args.backend, args.repeats)))
        return

    results: dict[str, dict[int, dict]] = {}
    for layout, key in LAYOUTS.items():
        results[layout] = {}
        for length in args.lengths:
            out = subprocess.run([sys.executable, "-m", "benchmarks.long_context", "--config", args.config,
                                  "--backend", args.backend, "--repeats", str(args.repeats), "--one", str(length),
                                  key], capture_output=True, text=True, check=True)
            results[layout][length] = json.loads(out.stdout.strip().splitlines()[-1])
            r = results[layout][length]
            print(f"{layout:<26} {length:>6} tokens  {r['seconds']:8.3f} s  peak {r['peak_mib']:8.0f} MiB"
                  f"  (+{r['activation_mib']:.0f} MiB during the forward)", flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2))
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for layout, rows in results.items():
            lengths = sorted(rows)
            left.plot(lengths, [rows[n]["seconds"] for n in lengths], "o-", label=layout)
            right.plot(lengths, [rows[n]["activation_mib"] for n in lengths], "o-", label=layout)
        for ax, label in ((left, "forward time (s)"), (right, "memory added by the forward (MiB)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length (tokens)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend()
        fig.suptitle(f"{args.config}, batch 1, {args.backend} attention, CPU")
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)
        print(f"figure written to {args.png}")


if __name__ == "__main__":
    main()
