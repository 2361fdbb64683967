"""Does pretraining help? Fine-tune each given encoder on SST-2 with identical settings, plus a randomly
initialised copy of the first one's architecture, and report dev accuracy side by side.

    python -m benchmarks.pretraining_helps --model runs/bert-mini-mlm [--model runs/bert-mini-electra ...]
                                           [--epochs 2 --batch_size 32 --max_length 64 --learning_rate 1e-4 --bf16]
                                           [--seeds 42 1 2] [--train_samples 2000]

The random copy has the same config and tokenizer, fresh weights (the initialisation `unmask pretrain` starts from,
seed 42).
With several `--seeds` every encoder is fine-tuned once per seed (shuffling, dropout, head initialisation), so a
difference between encoders can be read against the spread between seeds. `--train_samples N` fine-tunes on a
seeded random N of SST-2's 67k training sentences instead (the same N for every encoder and seed): pretraining
matters most where labelled data is scarce. `--dropout P` fine-tunes every encoder with dropout P (an encoder
pretrained without dropout, as short budgets favour, is usually fine-tuned with it).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import warnings
from pathlib import Path

import torch

from benchmarks.common import shared_data
from unmask import models
from unmask.config import config_from_dict
from unmask.hub import read_config
from unmask.models.bert import init_positions_sinusoidal
from unmask.tokenizer import load_tokenizer
from unmask.train.finetune import FinetuneArgs, finetune


def random_copy(model_dir: str, out: Path) -> str:
    """`model_dir`'s architecture and tokenizer with newly initialised weights (as `unmask pretrain` starts them:
    BERT positions from the sin/cos table, so the comparison isolates what pretraining learned)."""
    torch.manual_seed(42)
    config = read_config(Path(model_dir))
    model = models.from_config(config, "encoder")
    init_positions_sinusoidal(model, config.initializer_range)
    model.save_pretrained(out, tokenizer=load_tokenizer(model_dir))
    return str(out)


def with_dropout(model_dir: str, p: float, out: Path) -> str:
    """`model_dir` with its dropout probabilities set to `p` (its other files linked, not copied)."""
    out.mkdir(parents=True)
    for f in Path(model_dir).iterdir():
        if f.is_file() and f.name != "config.json":
            (out / f.name).symlink_to(f.resolve())
    config = read_config(Path(model_dir)).to_dict()
    names = ("hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout", "embedding_dropout",
             "mlp_dropout")
    config.update({name: p for name in names if name in config})
    config_from_dict(config, str(out)).to_json_file(out / "config.json")
    return str(out)


def training_subset(n: int, out: Path) -> Path:
    """A seeded random `n` of SST-2's training sentences, header kept, written to `out`."""
    header, *rows = shared_data("sst2", "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    if not 0 < n <= len(rows):
        raise SystemExit(f"--train_samples must be in 1..{len(rows)}, got {n}")
    out.write_text(header + "".join(random.Random(0).sample(rows, n)), encoding="utf-8")
    return out


def sst2(model_dir: str, args, out: Path, seed: int = 42) -> dict:
    start = time.perf_counter()
    result = finetune(FinetuneArgs(
        task="classify", model=model_dir, train_file=str(args.train_file),
        validation_file=str(shared_data("sst2", "dev.tsv")), output_dir=str(out), overwrite_output_dir=True,
        per_device_train_batch_size=args.batch_size, max_seq_length=args.max_length, num_train_epochs=args.epochs,
        learning_rate=args.learning_rate, weight_decay=0.01, bf16=args.bf16, seed=seed, logging_steps=200))
    return {"accuracy": result["eval_accuracy"], "seconds": time.perf_counter() - start,
            "best_step": result["best_step"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, help="a pretrained encoder directory (repeat)")
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42], help="fine-tuning seeds")
    parser.add_argument("--dropout", type=float, default=None,
                        help="fine-tune every encoder with this dropout; default: each config's own")
    parser.add_argument("--train_samples", type=int, default=None,
                        help="fine-tune on this many (seeded, random) SST-2 training sentences; default: all")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="unmask-pretraining-helps-"))
    args.train_file = (training_subset(args.train_samples, work / "train.tsv") if args.train_samples
                       else shared_data("sst2", "train.tsv"))
    contenders = {Path(m).name: m for m in args.model}
    contenders["random init"] = random_copy(args.model[0], work / "random")
    if args.dropout is not None:
        contenders = {name: with_dropout(path, args.dropout, work / f"dropout-{n}")
                      for n, (name, path) in enumerate(contenders.items())}
    results = {name: {} for name in contenders}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in args.seeds:  # seed-major: a run cut short still has every encoder at the first seeds
            for n, (name, path) in enumerate(contenders.items()):
                results[name][seed] = sst2(path, args, work / f"run{n}-seed{seed}", seed)
                print(f"{name}, seed {seed}: {results[name][seed]}", flush=True)
    print(f"\nSST-2 dev accuracy, {args.train_samples or 'all'} training sentences, {args.epochs:g} epochs, "
          f"batch {args.batch_size}, max length {args.max_length}, lr {args.learning_rate:g}, bf16={args.bf16}, "
          f"seeds {args.seeds}")
    for name, runs in results.items():
        accuracies = [r["accuracy"] for r in runs.values()]
        minutes = sum(r["seconds"] for r in runs.values()) / 60 / len(runs)
        print(f"  {name:<32} mean {sum(accuracies) / len(accuracies):.4f}   "
              f"({', '.join(f'{a:.4f}' for a in accuracies)})   {minutes:.1f} min a run")
    if args.output:
        Path(args.output).write_text(json.dumps({"args": {**vars(args), "train_file": str(args.train_file)},
                                                 "results": results}, indent=2))


if __name__ == "__main__":
    main()
