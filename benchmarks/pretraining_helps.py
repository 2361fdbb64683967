"""Does pretraining help? Fine-tune each given encoder on SST-2 with identical settings, plus a randomly
initialised copy of the first one's architecture, and report dev accuracy side by side.

    python -m benchmarks.pretraining_helps --model runs/bert-mini-mlm [--model runs/bert-mini-electra ...]
                                           [--epochs 2 --batch_size 32 --max_length 64 --learning_rate 1e-4 --bf16]

The random copy has the same config and tokenizer, fresh weights (the architecture's own initialisation, seed 42).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import torch

from benchmarks.common import shared_data
from unmask import models
from unmask.hub import load_tokenizer, read_config
from unmask.tasks.finetune import FinetuneArgs, finetune


def random_copy(model_dir: str, out: Path) -> str:
    """`model_dir`'s architecture and tokenizer with newly initialised weights."""
    torch.manual_seed(42)
    model = models.from_config(read_config(Path(model_dir)), "encoder")
    model.save_pretrained(out, tokenizer=load_tokenizer(model_dir))
    return str(out)


def sst2(model_dir: str, args, out: Path) -> dict:
    start = time.perf_counter()
    result = finetune(FinetuneArgs(
        task="classify", model=model_dir, train_file=str(shared_data("sst2", "train.tsv")),
        validation_file=str(shared_data("sst2", "dev.tsv")), output_dir=str(out),
        per_device_train_batch_size=args.batch_size, max_seq_length=args.max_length, num_train_epochs=args.epochs,
        learning_rate=args.learning_rate, weight_decay=0.01, bf16=args.bf16, seed=42, logging_steps=200))
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
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="unmask-pretraining-helps-"))
    contenders = {Path(m).name: m for m in args.model}
    contenders["random init"] = random_copy(args.model[0], work / "random")
    results = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n, (name, path) in enumerate(contenders.items()):
            results[name] = sst2(path, args, work / f"run{n}")
            print(f"{name}: {results[name]}", flush=True)
    print(f"\nSST-2 dev accuracy, {args.epochs:g} epochs, batch {args.batch_size}, max length {args.max_length}, "
          f"lr {args.learning_rate:g}, bf16={args.bf16}")
    for name, r in results.items():
        print(f"  {name:<32} {r['accuracy']:.4f}   {r['seconds'] / 60:.1f} min")
    if args.output:
        Path(args.output).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
