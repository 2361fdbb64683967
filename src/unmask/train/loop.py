"""The one training loop, shared by pretraining and fine-tuning. No framework: a `while` over optimizer steps.

    step:  make_batch(step) gives the whole global step, collated (all ranks, all micro-batches)
           -> for each micro-batch: forward on this rank's rows -> backward        (`accumulate`)
           -> clip -> the scheduled learning rate -> AdamW step                    (`update`)
    every logging_steps: a line in metrics.jsonl and the progress bar             (`Run.log`)
    every eval_steps:    evaluate() (rank 0), best model exported, early stopping (`Run.evaluate`)
    every save_steps:    checkpoint-N/ = model directory + training_state.pt      (`Run.save`)

Losses are means over *units* (masked tokens, tagged tokens, or examples) and each micro-batch is weighted by its
share of the units of the whole global step, so neither the number of processes nor gradient accumulation changes
the update: N processes make the same step as one process with the same global batch.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from unmask.errors import TrainingError
from unmask.hub import load_weights, read_weights
from unmask.models import warn_if_slow_bf16
from unmask.models.outputs import IGNORE_INDEX
from unmask.progress import progress
from unmask.train.args import TrainingArgs
from unmask.train.checkpoint import resume_point, save_checkpoint
from unmask.train.distributed import Distributed, average_gradients
from unmask.train.metrics_log import MetricsLog, plot_loss_curve
from unmask.train.optim import allocate_state, lr_factor, make_optimizer, set_learning_rate


@dataclass
class Evaluation:
    """How a run is evaluated: `evaluate()` returns metrics (without the `eval_` prefix). With `metric` (e.g.
    "eval_accuracy"), the best evaluated model is the exported one, and `patience` evaluations without a gain stop
    the run early."""

    evaluate: Callable[[], dict]
    metric: str | None = None
    greater_is_better: bool = True
    patience: int | None = None


@dataclass
class LoopState:
    """Where the run is; saved in every checkpoint (with the optimizer and the random states) to continue exactly."""

    step: int = 0
    elapsed: float = 0.0  # training seconds before this process started (a resumed run)
    best: float | None = None
    best_step: int | None = None
    bad_evals: int = 0
    last_eval_step: int | None = None


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


def autocast(enabled: bool, device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else nullcontext()


def count_units(labels: torch.Tensor) -> int:
    """What a mean loss averages over: labelled tokens (-100 elsewhere), or examples for float targets."""
    if labels.is_floating_point():
        return labels.shape[0]
    return int((labels != IGNORE_INDEX).sum())


@dataclass
class Window:
    """What the next metrics line averages: the steps since the last one."""

    start: float = field(default_factory=time.perf_counter)
    tokens: int = 0
    loss: float = 0.0
    steps: int = 0


class Run:
    """One training run: the model, its optimizer and where it is. `train_loop` drives it step by step."""

    def __init__(self, model, tokenizer, args: TrainingArgs, dist: Distributed, evaluation: Evaluation | None,
                 generators: tuple[torch.Generator, ...], model_kwargs: dict, stream=None):
        self.model, self.tokenizer, self.args, self.dist = model, tokenizer, args, dist
        self.evaluation, self.generators, self.model_kwargs = evaluation, generators, model_kwargs
        self.stream = stream
        self.output_dir = Path(args.output_dir)
        head_scale = 1.0 if args.head_learning_rate is None else args.head_learning_rate / args.learning_rate
        self.optimizer = make_optimizer(model, args.learning_rate, args.weight_decay, betas=(0.9, args.adam_beta2),
                                        eps=args.adam_epsilon, head_lr_scale=head_scale)
        self.state = LoopState()
        if args.resume_from_checkpoint:
            self.resume()
        self.metrics = MetricsLog(self.output_dir / "metrics.jsonl",
                                  self.state.step if args.resume_from_checkpoint else None, dist.is_main)
        model.to(dist.device).train()
        self.settle_gradients = allocate_state(self.optimizer)
        # a model DDP cannot serve (a bi-encoder: see BiEncoder) has its gradients averaged in `accumulate`
        wrap = dist.world_size > 1 and not getattr(model, "averages_gradients_itself", False)
        self.ddp_model = torch.nn.parallel.DistributedDataParallel(model) if wrap else model
        # compiled for the training steps only (evaluation runs `model` eagerly); the parameters are shared
        self.forward = torch.compile(self.ddp_model) if args.torch_compile else self.ddp_model
        self.started = time.perf_counter()
        self.window = Window()
        self.lr = 0.0

    def resume(self) -> None:
        """Weights, optimizer, random states and loop state from a checkpoint."""
        checkpoint, saved = resume_point(self.output_dir, self.args.resume_from_checkpoint)
        if self.dist.is_main:
            print(f"resuming from {checkpoint} (step {saved['loop']['step']})", file=sys.stderr, flush=True)
        if hasattr(self.model, "restore_weights"):  # a pretrainer whose checkpoint is more than the exported model
            self.model.restore_weights(checkpoint)
        else:
            load_weights(self.model, read_weights(checkpoint), str(checkpoint))
        self.optimizer.load_state_dict(saved["optimizer"])
        # each rank's own draws (its rows differ, so dropout and masking consumed its generators differently); a
        # cached run resumed on more processes gives the new ones rank 0's
        randoms = saved.get("random") or [{"torch": saved["torch_rng"], "generators": saved["generators"]}]  # older
        mine = randoms[self.dist.rank] if self.dist.rank < len(randoms) else randoms[0]
        torch.set_rng_state(mine["torch"])
        for generator, rng in zip(self.generators, mine["generators"]):
            generator.set_state(rng)
        self.state = LoopState(**saved["loop"])
        if self.stream is not None:
            self.restore_stream(saved.get("streams"), checkpoint)

    def restore_stream(self, positions: list[dict] | None, checkpoint: Path) -> None:
        """This rank's data position, saved by the run's rank 0 for every rank."""
        if positions is None:
            raise TrainingError(f"{checkpoint} holds no stream position: it was saved by a run that did not stream "
                                "(resume it without --streaming)")
        if len(positions) != self.dist.world_size:
            raise TrainingError(f"{checkpoint} was saved by {len(positions)} streaming processes: resume with as many "
                                f"(each reads its own documents), not {self.dist.world_size}")
        self.stream.load_state_dict(positions[self.dist.rank])

    def elapsed(self) -> float:
        return self.state.elapsed + time.perf_counter() - self.started

    def accumulate(self, batch: dict[str, torch.Tensor]) -> float:
        """Forward and backward over this rank's micro-batches of the global step; returns the step's mean loss."""
        args, dist = self.args, self.dist
        rows = args.per_device_train_batch_size
        if self.stream is None:  # the batch is the whole global step
            n_units, ranks, rank = count_units(batch["labels"]), dist.world_size, dist.rank
        else:  # the batch is this rank's rows only
            n_units, ranks, rank = int(dist.sum(count_units(batch["labels"]))), 1, 0
        step_loss = 0.0
        for k in range(args.gradient_accumulation_steps):
            offset = (k * ranks + rank) * rows
            local = to_device(batch, dist.device, slice(offset, offset + rows))
            last = k == args.gradient_accumulation_steps - 1
            with self.ddp_model.no_sync() if self.ddp_model is not self.model and not last else nullcontext():
                with autocast(args.bf16, dist.device):
                    out = self.forward(**local, **self.model_kwargs)
                share = count_units(local["labels"]) / max(1, n_units)
                # DDP averages gradients over ranks, hence x world_size
                (out.loss * share * dist.world_size).backward()
            step_loss += float(out.loss.detach()) * share
            # every text of the batch: a bi-encoder's candidates too (attention_mask_b)
            self.window.tokens += sum(int(v.sum()) for k, v in local.items() if k.startswith("attention_mask"))
        if self.ddp_model is self.model:
            average_gradients(self.model.parameters())  # one process: nothing to do
        return dist.sum(step_loss)

    def update(self, step_loss: float) -> None:
        """Clip, set the scheduled learning rate, take the optimizer step."""
        args, state = self.args, self.state
        if not math.isfinite(step_loss):
            raise TrainingError(f"loss is {step_loss} at step {state.step + 1}: lower --learning_rate or raise "
                                "--warmup_steps, or resume from the last checkpoint")
        if self.settle_gradients is not None:  # after the first backward
            self.settle_gradients()
            self.settle_gradients = None
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), args.max_grad_norm)
        decay = (state.step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps)
        if args.max_train_minutes:
            decay = max(decay, self.elapsed() / (args.max_train_minutes * 60))
        self.lr = args.learning_rate * lr_factor(state.step, args.warmup_steps, decay, args.lr_scheduler_type,
                                                 args.decay_ratio)
        set_learning_rate(self.optimizer, self.lr)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)  # kept: see allocate_state
        state.step += 1
        self.window.loss += step_loss
        self.window.steps += 1

    def log(self, bar: tqdm) -> dict:
        """One metrics line over the steps since the last one."""
        window = self.window
        row = {"step": self.state.step, "loss": window.loss / window.steps, "learning_rate": self.lr,
               "tokens_per_second": self.dist.sum(window.tokens) / (time.perf_counter() - window.start),
               "elapsed_seconds": self.elapsed()}
        bar.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_second']:,.0f}")
        self.metrics.write(row)
        self.window = Window()
        return row

    def evaluate(self) -> bool:
        """Evaluate, export the model if it is the best so far; True when patience has run out."""
        evaluation, state = self.evaluation, self.state
        if self.args.show_progress and self.dist.is_main:
            tqdm.write(f"step {state.step}: evaluating", file=sys.stderr)
        result = {f"eval_{k}": v for k, v in evaluation.evaluate().items()}
        self.metrics.write({"step": state.step, **result})
        if self.dist.is_main:  # on the terminal and in a log file alike, as well as in metrics.jsonl
            shown = "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items())
            tqdm.write(f"step {state.step}: {shown}", file=sys.stderr)
        state.last_eval_step = state.step
        if evaluation.metric is None:
            return False
        value = result[evaluation.metric]
        better = state.best is None or (value > state.best if evaluation.greater_is_better else value < state.best)
        if better:
            state.best, state.bad_evals, state.best_step = value, 0, state.step
            self.model.save_pretrained(self.output_dir, tokenizer=self.tokenizer)
        else:
            state.bad_evals += 1
        return evaluation.patience is not None and state.bad_evals >= evaluation.patience

    def save(self) -> None:
        """checkpoint-N/: the model directory, and beside it what continuing needs (rank 0 writes it; every rank
        calls this, for the streams' positions)."""
        streams = self.dist.gather(self.stream.state_dict()) if self.stream is not None else None
        randoms = self.dist.gather({"torch": torch.get_rng_state(),
                                    "generators": [g.get_state() for g in self.generators]})
        if not self.dist.is_main:
            return
        step_rows = self.args.per_device_train_batch_size * self.dist.world_size * self.args.gradient_accumulation_steps
        saved = {"optimizer": self.optimizer.state_dict(), "random": randoms,
                 "loop": {**dataclasses.asdict(self.state), "elapsed": self.elapsed()},
                 "samples_seen": self.state.step * step_rows, "streams": streams}
        save_checkpoint(self.output_dir, self.state.step, self.model, self.tokenizer, saved,
                        keep=self.args.save_total_limit)

    def finish(self, last_row: dict, stop_reason: str) -> dict:
        """Export the final (or best) model, draw the loss curve; the run's summary."""
        state, evaluation = self.state, self.evaluation
        final = {"step": state.step, "train_loss": last_row.get("loss"), "stopped_by": stop_reason,
                 "train_seconds": self.elapsed()}
        if evaluation is not None and self.dist.is_main and state.last_eval_step != state.step:
            self.evaluate()  # the final model has not been evaluated yet
        if self.dist.is_main:
            evals = [r for r in self.metrics.rows() if any(k.startswith("eval_") for k in r)]
            if evaluation is None or evaluation.metric is None:
                self.model.save_pretrained(self.output_dir, tokenizer=self.tokenizer)
                chosen = evals[-1] if evals else {}
                print(f"saved the model of step {state.step} to {self.output_dir} ({final['train_seconds']:.0f} s "
                      "of training)", file=sys.stderr, flush=True)
            else:  # the exported model is the best one: report its numbers
                chosen = next(r for r in evals if r["step"] == state.best_step)
                final["best_step"] = state.best_step
                print(f"saved the best model (step {state.best_step}, {evaluation.metric} "
                      f"{chosen[evaluation.metric]:.4f}) to {self.output_dir}", file=sys.stderr, flush=True)
            final.update({k: v for k, v in chosen.items() if k.startswith("eval_")})
            if self.metrics.path.exists():
                plot_loss_curve(self.metrics.path, self.output_dir / "loss_curve.png")
        self.dist.barrier()
        return final


def train_loop(model, tokenizer, args: TrainingArgs, make_batch: Callable[[int, int], dict[str, torch.Tensor]],
               dist: Distributed, *, evaluation: Evaluation | None = None,
               generators: tuple[torch.Generator, ...] = (), model_kwargs: dict | None = None, stream=None) -> dict:
    """Train `model` and export it to `args.output_dir` (the best evaluated model when `evaluation.metric` is set).

    `make_batch(step, size)` returns the collated global step of `size` rows; `generators` are the random sources
    of the data side (the collator's), saved in checkpoints so a resumed run draws the same masks; `model_kwargs`
    go to every training forward (pretraining's `sparse_prediction=True`). With a `stream` (each rank reading its
    own documents, data/streaming.py), `make_batch` returns this rank's rows only and the stream's position
    (`state_dict` / `load_state_dict`) is saved in checkpoints and restored on resume.
    """
    warn_if_slow_bf16(args.bf16, dist.device)
    run = Run(model, tokenizer, args, dist, evaluation, generators, model_kwargs or {}, stream)
    step_rows = args.per_device_train_batch_size * args.gradient_accumulation_steps
    step_rows *= dist.world_size if stream is None else 1
    bar = progress(total=args.max_steps, initial=run.state.step, desc="training",
                   disable=not (args.show_progress and dist.is_main))
    last_row, stop_reason = {}, "max_steps"
    while run.state.step < args.max_steps:
        if args.max_train_minutes and run.elapsed() >= args.max_train_minutes * 60:
            stop_reason = "time budget"
            break
        run.update(run.accumulate(make_batch(run.state.step, step_rows)))
        bar.update(1)
        step = run.state.step
        if step % args.logging_steps == 0 or step == args.max_steps:
            last_row = run.log(bar)
        stop = False
        if evaluation is not None and args.eval_steps and step % args.eval_steps == 0 and dist.is_main:
            stop = run.evaluate()
        if args.save_steps and step % args.save_steps == 0:
            run.save()
        if dist.world_size > 1:  # every rank learns whether rank 0 stopped early
            stop = dist.sum(float(stop)) > 0
        if stop:
            stop_reason = "early stopping"
            break
    if run.window.steps:
        last_row = run.log(bar)
    bar.close()
    return run.finish(last_row, stop_reason)
