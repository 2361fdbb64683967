"""The one training loop, shared by pretraining and fine-tuning. No framework: a `while` over optimizer steps.

    step:  make_batch(step) gives the whole global step, collated (all ranks, all micro-batches)
           -> for each micro-batch: forward on this rank's rows -> backward
           -> clip -> the scheduled learning rate -> AdamW step
    every logging_steps: a line in metrics.jsonl and the progress bar
    every eval_steps:    evaluate() (rank 0), best model exported, early stopping
    every save_steps:    checkpoint-N/ = model directory + training_state.pt, atomically

Losses are means over *units* (masked tokens, tagged tokens, or examples) and each micro-batch is weighted by its
share of the units of the whole global step, so neither the number of processes nor gradient accumulation changes
the update: N processes make the same step as one process with the same global batch.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as torch_dist
from tqdm.auto import tqdm

from unmask.hub import atomic_write, atomic_write_text, load_weights, read_weights
from unmask.memory import keep_freed_memory
from unmask.train.checkpoint import latest_checkpoint, load_training_state, save_checkpoint
from unmask.train.optim import lr_factor, make_optimizer, set_learning_rate


class TrainingError(RuntimeError):
    """Training cannot go on (a NaN loss, a bad resume point); the message says what to change."""


@dataclass(kw_only=True)
class TrainingArgs:
    """The loop's settings; the task's own arguments extend these (flag names are HF TrainingArguments')."""

    output_dir: str
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 64
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-4
    weight_decay: float = 0.01
    adam_beta2: float = 0.98
    adam_epsilon: float = 1e-6  # BERT's pretraining value; fine-tuning uses HF's 1e-8
    max_grad_norm: float = 1.0
    max_steps: int = 1000
    max_train_minutes: float | None = None  # a wall-clock budget; the schedule decays over whichever ends first
    warmup_steps: int = 100
    lr_scheduler_type: str = "linear"
    bf16: bool = False
    torch_compile: bool = False  # compile the training forward (and so its backward): slow first steps, pays on GPUs
    attn_backend: str = "varlen"  # ModernBERT: varlen (unpadded) or sdpa (padded, as transformers); BERT unpads
    logging_steps: int = 10
    eval_steps: int | None = None
    save_steps: int | None = None
    save_total_limit: int = 2
    seed: int = 42
    resume_from_checkpoint: str | None = None  # a checkpoint directory, or "latest" in output_dir
    show_progress: bool = True

    def __post_init__(self):
        for name in ["per_device_train_batch_size", "gradient_accumulation_steps", "logging_steps"]:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.max_steps < 0 or self.warmup_steps < 0:
            raise ValueError("--max_steps and --warmup_steps cannot be negative")
        if self.learning_rate <= 0:
            raise ValueError(f"--learning_rate must be positive, got {self.learning_rate}")
        if self.lr_scheduler_type not in ("linear", "cosine", "constant"):
            raise ValueError(f"--lr_scheduler_type must be linear, cosine or constant, got {self.lr_scheduler_type}")
        if self.attn_backend not in ("sdpa", "varlen"):
            raise ValueError(f"--attn_backend must be sdpa or varlen, got {self.attn_backend!r}")


@dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world_size > 1:
            torch_dist.barrier()

    def sum(self, value: float) -> float:
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        torch_dist.all_reduce(t)
        return float(t.item())


def init_distributed() -> Distributed:
    """One process, or one rank of a `torchrun` job (gloo on CPU, nccl on GPU)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if world_size > 1 and not torch_dist.is_initialized():
        torch_dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = torch_dist.get_rank() if world_size > 1 else 0
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return Distributed(rank, world_size, device)


class SampleOrder:
    """A seeded permutation per epoch; position `cursor` in the endless stream is all that resuming needs."""

    def __init__(self, n: int, seed: int):
        if n < 1:
            raise TrainingError("no training examples")
        self.n, self.seed, self._epoch, self._perm = n, seed, -1, np.arange(0)

    def take(self, cursor: int, count: int) -> list[int]:
        out = []
        for i in range(cursor, cursor + count):
            epoch = i // self.n
            if epoch != self._epoch:
                self._epoch, self._perm = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n)
            out.append(int(self._perm[i % self.n]))
        return out


def to_device(batch: dict[str, torch.Tensor], device: torch.device, rows: slice | None = None) -> dict:
    return {k: (v[rows] if rows is not None else v).to(device, non_blocking=True) for k, v in batch.items()}


def cpu_has_fast_bf16() -> bool:
    """AVX512-BF16 or AMX: without either, CPU bf16 matmuls are emulated (measured here on an AVX2-only EPYC:
    1 GFLOP/s in bf16 against 86 in fp32 for the same product)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def check_bf16(enabled: bool, device: torch.device) -> None:
    if enabled and device.type == "cpu" and not cpu_has_fast_bf16():
        warnings.warn("--bf16 on a CPU without AVX512-BF16 or AMX: bf16 matrix products are emulated here and run "
                      "10-80x slower than fp32; drop --bf16 on this machine", stacklevel=2)


def autocast(enabled: bool, device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else nullcontext()


def count_units(labels: torch.Tensor) -> int:
    """What a mean loss averages over: labelled tokens (-100 elsewhere), or examples for float targets."""
    if labels.is_floating_point():
        return labels.shape[0]
    return int((labels != -100).sum())


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


class MetricsLog:
    """metrics.jsonl, one JSON object per line; a resumed run drops the lines written after its checkpoint."""

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


def train_loop(model, tokenizer, args: TrainingArgs, make_batch: Callable[[int, int], dict[str, torch.Tensor]],
               dist: Distributed, *, evaluate: Callable[[], dict] | None = None, metric_for_best: str | None = None,
               greater_is_better: bool = True, early_stopping_patience: int | None = None,
               generators: tuple[torch.Generator, ...] = ()) -> dict:
    """Train `model` and export it to `args.output_dir` (the best evaluated model when `metric_for_best` is set).

    `make_batch(step, size)` returns the collated global step of `size` rows; `generators` are the random sources
    of the data side (the collator's), saved in checkpoints so a resumed run draws the same masks.
    """
    keep_freed_memory()  # large per-step tensors are reused, not page-faulted in again (see unmask/memory.py)
    check_bf16(args.bf16, dist.device)
    for module in model.modules():  # every ModernBERT encoder inside (ELECTRA has two); a run-time choice
        if hasattr(module, "attn_backend"):
            module.attn_backend = args.attn_backend
    output_dir = Path(args.output_dir)
    optimizer = make_optimizer(model, args.learning_rate, args.weight_decay, betas=(0.9, args.adam_beta2),
                               eps=args.adam_epsilon)
    state = {"step": 0, "elapsed": 0.0, "best": None, "best_step": None, "bad_evals": 0, "last_eval_step": None}
    if args.resume_from_checkpoint:
        checkpoint = (latest_checkpoint(output_dir) if args.resume_from_checkpoint == "latest"
                      else Path(args.resume_from_checkpoint))
        if checkpoint is None:
            raise TrainingError(f"--resume_from_checkpoint latest: no complete checkpoint in {output_dir}")
        saved = load_training_state(checkpoint)
        if hasattr(model, "restore_weights"):  # a pretrainer whose checkpoint is more than the exported model
            model.restore_weights(checkpoint)
        else:
            load_weights(model, read_weights(checkpoint), str(checkpoint))
        optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["torch_rng"])
        for generator, rng in zip(generators, saved["generators"]):
            generator.set_state(rng)
        state.update(saved["loop"])
    metrics = MetricsLog(output_dir / "metrics.jsonl", state["step"] if args.resume_from_checkpoint else None,
                         dist.is_main)

    model.to(dist.device).train()
    ddp_model = torch.nn.parallel.DistributedDataParallel(model) if dist.world_size > 1 else model
    # compiled for the training steps only (evaluation runs `model` eagerly); the parameters are shared
    forward = torch.compile(ddp_model) if args.torch_compile else ddp_model
    rows = args.per_device_train_batch_size
    global_rows = rows * dist.world_size
    step_rows = global_rows * args.gradient_accumulation_steps
    budget_s = args.max_train_minutes * 60 if args.max_train_minutes else None
    progress = tqdm(total=args.max_steps, initial=state["step"], desc="training",
                    disable=not (args.show_progress and dist.is_main))
    start = time.perf_counter()
    window = {"tokens": 0, "loss": 0.0, "steps": 0, "start": start}
    lr, last_row, stop_reason = 0.0, {}, "max_steps"

    def elapsed() -> float:
        return state["elapsed"] + time.perf_counter() - start

    def log_window() -> dict:
        now = time.perf_counter()
        row = {"step": state["step"], "loss": window["loss"] / window["steps"], "learning_rate": lr,
               "tokens_per_second": dist.sum(window["tokens"]) / (now - window["start"]),
               "elapsed_seconds": elapsed()}
        progress.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_second']:,.0f}")
        metrics.write(row)
        window.update(tokens=0, loss=0.0, steps=0, start=time.perf_counter())
        return row

    def run_evaluation() -> bool:
        """Evaluate, export the model if it is the best so far; True when patience has run out."""
        result = {f"eval_{k}": v for k, v in evaluate().items()}
        metrics.write({"step": state["step"], **result})
        state["last_eval_step"] = state["step"]
        if metric_for_best is None:
            return False
        value = result[metric_for_best]
        better = state["best"] is None or (value > state["best"] if greater_is_better else value < state["best"])
        if better:
            state.update(best=value, bad_evals=0, best_step=state["step"])
            model.save_pretrained(output_dir, tokenizer=tokenizer)
        else:
            state["bad_evals"] += 1
        return early_stopping_patience is not None and state["bad_evals"] >= early_stopping_patience

    while state["step"] < args.max_steps:
        if budget_s is not None and elapsed() >= budget_s:
            stop_reason = "time budget"
            break
        batch = make_batch(state["step"], step_rows)
        n_units = count_units(batch["labels"])  # over the whole global step
        step_loss = 0.0
        for k in range(args.gradient_accumulation_steps):
            offset = k * global_rows + dist.rank * rows
            local = to_device(batch, dist.device, slice(offset, offset + rows))
            sync = (ddp_model.no_sync() if dist.world_size > 1 and k < args.gradient_accumulation_steps - 1
                    else nullcontext())
            with sync:
                with autocast(args.bf16, dist.device):
                    out = forward(**local)
                share = count_units(local["labels"]) / max(1, n_units)
                # DDP averages gradients over ranks, hence x world_size
                (out.loss * share * dist.world_size).backward()
            step_loss += float(out.loss.detach()) * share
            window["tokens"] += int(local["attention_mask"].sum())
        step_loss = dist.sum(step_loss)
        if not math.isfinite(step_loss):
            raise TrainingError(f"loss is {step_loss} at step {state['step'] + 1}: lower --learning_rate or raise "
                                "--warmup_steps, or resume from the last checkpoint")
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        decay = (state["step"] - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps)
        if budget_s is not None:
            decay = max(decay, elapsed() / budget_s)
        lr = args.learning_rate * lr_factor(state["step"], args.warmup_steps, decay, args.lr_scheduler_type)
        set_learning_rate(optimizer, lr)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state["step"] += 1
        window["loss"] += step_loss
        window["steps"] += 1
        progress.update(1)

        step = state["step"]
        if step % args.logging_steps == 0 or step == args.max_steps:
            last_row = log_window()
        stop = False
        if evaluate is not None and args.eval_steps and step % args.eval_steps == 0 and dist.is_main:
            stop = run_evaluation()
        if args.save_steps and step % args.save_steps == 0 and dist.is_main:
            saved = {"optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                     "generators": [g.get_state() for g in generators],
                     "loop": {**state, "elapsed": elapsed()}, "samples_seen": step * step_rows}
            save_checkpoint(output_dir, step, model, tokenizer, saved, keep=args.save_total_limit)
        if dist.world_size > 1:  # every rank learns whether rank 0 stopped early
            stop = dist.sum(float(stop)) > 0
        if stop:
            stop_reason = "early stopping"
            break
    if window["steps"]:
        last_row = log_window()
    progress.close()

    final = {"step": state["step"], "train_loss": last_row.get("loss"), "stopped_by": stop_reason,
             "train_seconds": elapsed()}
    if evaluate is not None and dist.is_main and state.get("last_eval_step") != state["step"]:
        run_evaluation()  # the final model has not been evaluated yet
    if dist.is_main:
        evals = [r for r in metrics.rows() if any(k.startswith("eval_") for k in r)]
        if metric_for_best is None:
            model.save_pretrained(output_dir, tokenizer=tokenizer)
            chosen = evals[-1] if evals else {}
        else:  # the exported model is the best one: report its numbers
            chosen = next(r for r in evals if r["step"] == state["best_step"])
            final["best_step"] = state["best_step"]
        final.update({k: v for k, v in chosen.items() if k.startswith("eval_")})
        if metrics.path.exists():
            plot_loss_curve(metrics.path, output_dir / "loss_curve.png")
    dist.barrier()
    return final
