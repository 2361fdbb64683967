"""Masked-LM pretraining: one plain loop, from text files to a model directory `transformers` loads as it is.

    step:  collate the step's micro-batches (dynamic masking) -> forward (sparse MLM head) -> backward
           -> clip -> set the scheduled learning rate -> AdamW step
    every logging_steps: a line in metrics.jsonl; every eval_steps: validation loss / accuracy / perplexity;
    every save_steps: checkpoint-N/ (model + training_state.pt), atomically.

Data-parallel under `torchrun`: every rank draws the masks of the whole global step from the same generator and
trains on its own rows of it, and the loss is normalised by the labelled tokens of the global step, so N processes
(or N accumulation steps) compute the same update as one process with the same global batch.
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as torch_dist
from tqdm.auto import tqdm

from unmask.config import load_config
from unmask.data.collate import MLMCollator
from unmask.data.pretraining import PackedDataset, build_token_cache
from unmask.hub import atomic_write, atomic_write_text, load_weights, read_weights
from unmask.models.bert import BertForMaskedLM
from unmask.tokenizer import Tokenizer, train_tokenizer
from unmask.train.checkpoint import latest_checkpoint, load_training_state, save_checkpoint
from unmask.train.optim import lr_factor, make_optimizer, set_learning_rate


class TrainingError(RuntimeError):
    """Training cannot go on (a NaN loss, a bad resume point); the message says what to change."""


def default_cache_root() -> Path:
    return Path(os.environ.get("UNMASK_CACHE", Path.home() / ".cache" / "unmask")) / "tokens"


@dataclass
class PretrainArgs:
    train_file: list[str]
    output_dir: str
    validation_file: list[str] = field(default_factory=list)
    model_config: str = "bert-mini"  # a preset name or a config.json
    tokenizer: str | None = None  # an HF tokenizer directory; None trains one with vocab_size
    vocab_size: int = 30522
    max_seq_length: int = 128
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 64
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-4
    weight_decay: float = 0.01
    adam_beta2: float = 0.98
    max_grad_norm: float = 1.0
    max_steps: int = 1000
    max_train_minutes: float | None = None  # a wall-clock budget; the schedule decays over whichever ends first
    warmup_steps: int = 100
    lr_scheduler_type: str = "linear"
    mlm_probability: float = 0.15
    whole_word_mask: bool = False
    cross_documents: bool = False
    bf16: bool = False
    logging_steps: int = 10
    eval_steps: int | None = None
    max_eval_samples: int | None = None
    save_steps: int | None = None
    save_total_limit: int = 2
    seed: int = 42
    resume_from_checkpoint: str | None = None  # a checkpoint directory, or "latest" in output_dir
    text_field: str = "text"
    cache_dir: str | None = None
    show_progress: bool = True

    def __post_init__(self):
        for name in ["per_device_train_batch_size", "gradient_accumulation_steps", "max_steps", "logging_steps"]:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"--mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if self.learning_rate <= 0:
            raise ValueError(f"--learning_rate must be positive, got {self.learning_rate}")


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
        self.n, self.seed, self._epoch, self._perm = n, seed, -1, np.arange(0)

    def take(self, cursor: int, count: int) -> list[int]:
        out = []
        for i in range(cursor, cursor + count):
            epoch = i // self.n
            if epoch != self._epoch:
                self._epoch, self._perm = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n)
            out.append(int(self._perm[i % self.n]))
        return out


def prepare_tokenizer(args: PretrainArgs, dist: Distributed) -> Tokenizer:
    if args.tokenizer:
        return Tokenizer.from_pretrained(args.tokenizer)
    tokenizer_dir = Path(args.output_dir) / "tokenizer"
    if dist.is_main and not (tokenizer_dir / "tokenizer.json").exists():
        train_tokenizer(args.train_file, args.vocab_size, output_dir=tokenizer_dir, text_field=args.text_field,
                        model_max_length=args.max_seq_length, show_progress=args.show_progress)
    dist.barrier()
    return Tokenizer.from_pretrained(tokenizer_dir)


def _to(batch: dict[str, torch.Tensor], device: torch.device, rows: slice | None = None) -> dict[str, torch.Tensor]:
    return {k: (v[rows] if rows is not None else v).to(device, non_blocking=True) for k, v in batch.items()}


def _autocast(enabled: bool, device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else nullcontext()


@torch.no_grad()
def evaluate_mlm(model, dataset: PackedDataset, tokenizer: Tokenizer, batch_size: int = 64,
                 mlm_probability: float = 0.15, max_samples: int | None = None, bf16: bool = False,
                 seed: int = 0, device: torch.device = torch.device("cpu")) -> dict:
    """Masked-LM loss, masked-token accuracy and perplexity, with a fixed masking seed (comparable across runs)."""
    was_training = model.training
    model.eval()
    collate = MLMCollator.from_tokenizer(tokenizer, mlm_probability=mlm_probability, seed=seed)
    n = len(dataset) if max_samples is None else min(len(dataset), max_samples)
    loss_sum, correct, count = 0.0, 0, 0
    for start in range(0, n, batch_size):
        batch = _to(collate([dataset[i] for i in range(start, min(n, start + batch_size))]), device)
        with _autocast(bf16, device):
            out = model(**batch)
        k = int(out.labelled_positions.sum())
        if k == 0:
            continue
        loss_sum += float(out.loss) * k
        correct += int((out.logits.argmax(-1) == batch["labels"][out.labelled_positions]).sum())
        count += k
    model.train(was_training)
    if count == 0:
        raise TrainingError("the validation data has no maskable tokens")
    loss = loss_sum / count
    return {"loss": loss, "accuracy": correct / count, "perplexity": math.exp(min(loss, 50.0)), "tokens": count}


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
    ax.set_ylabel("masked-LM loss")
    ax.set_title("Pretraining")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_write(png, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def pretrain(args: PretrainArgs) -> dict:
    """Run masked-LM pretraining; returns the final metrics. The model is exported to `args.output_dir`."""
    dist = init_distributed()
    torch.manual_seed(args.seed)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = prepare_tokenizer(args, dist)
    config = load_config(args.model_config, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id)
    if args.max_seq_length > config.max_position_embeddings:
        raise ValueError(f"--max_seq_length {args.max_seq_length} exceeds the model's max_position_embeddings "
                         f"{config.max_position_embeddings}")
    model = BertForMaskedLM(config)

    cache_root = Path(args.cache_dir) if args.cache_dir else default_cache_root()
    if dist.is_main:  # rank 0 tokenizes; the others wait, then open the same cache
        build_token_cache(args.train_file, tokenizer, cache_root, args.text_field, args.show_progress)
    dist.barrier()
    train_data = PackedDataset.from_cache(build_token_cache(args.train_file, tokenizer, cache_root, args.text_field,
                                                            False), tokenizer, args.max_seq_length,
                                          args.cross_documents)
    valid_data = None
    if args.validation_file:
        cache = build_token_cache(args.validation_file, tokenizer, cache_root, args.text_field, False)
        valid_data = PackedDataset.from_cache(cache, tokenizer, args.max_seq_length)

    collate = MLMCollator.from_tokenizer(tokenizer, mlm_probability=args.mlm_probability,
                                         whole_word_mask=args.whole_word_mask, seed=args.seed)
    optimizer = make_optimizer(model, args.learning_rate, args.weight_decay, betas=(0.9, args.adam_beta2))
    step, elapsed_before = 0, 0.0
    metrics_file = output_dir / "metrics.jsonl"
    if args.resume_from_checkpoint:
        checkpoint = (latest_checkpoint(output_dir) if args.resume_from_checkpoint == "latest"
                      else Path(args.resume_from_checkpoint))
        if checkpoint is None:
            raise TrainingError(f"--resume_from_checkpoint latest: no complete checkpoint in {output_dir}")
        state = load_training_state(checkpoint)
        load_weights(model, read_weights(checkpoint), str(checkpoint))
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        collate.generator.set_state(state["collate_rng"])
        step, elapsed_before = int(state["step"]), float(state["elapsed"])
        if metrics_file.exists() and dist.is_main:  # drop lines logged after the checkpoint
            kept = [l for l in metrics_file.read_text().splitlines() if l and json.loads(l)["step"] <= step]
            atomic_write_text(metrics_file, "".join(line + "\n" for line in kept))
    elif dist.is_main:
        metrics_file.unlink(missing_ok=True)

    model.to(dist.device).train()
    ddp_model = model
    if dist.world_size > 1:
        ddp_model = torch.nn.parallel.DistributedDataParallel(model)
    order = SampleOrder(len(train_data), args.seed)
    rows_per_rank = args.per_device_train_batch_size
    global_batch = rows_per_rank * dist.world_size
    budget_s = args.max_train_minutes * 60 if args.max_train_minutes else None

    if dist.is_main:
        atomic_write_text(output_dir / "pretrain_args.json", json.dumps(asdict(args), indent=2) + "\n")
    progress = tqdm(total=args.max_steps, initial=step, desc="pretraining", disable=not (args.show_progress
                                                                                        and dist.is_main))
    start_time = time.perf_counter()
    window_tokens, window_loss, window_steps, window_start = 0, 0.0, 0, time.perf_counter()
    result: dict = {}
    lr = 0.0

    def log_window(step: int, lr: float) -> dict:
        """One metrics.jsonl line for the steps since the last one (mean loss, tokens/s over the window)."""
        nonlocal window_tokens, window_loss, window_steps, window_start
        now = time.perf_counter()
        tokens = dist.sum(window_tokens)
        row = {"step": step, "loss": window_loss / window_steps, "learning_rate": lr,
               "tokens_per_second": tokens / (now - window_start), "elapsed_seconds": elapsed_before + now - start_time}
        progress.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_second']:,.0f}")
        if dist.is_main:
            with metrics_file.open("a") as f:
                f.write(json.dumps(row) + "\n")
        window_tokens, window_loss, window_steps, window_start = 0, 0.0, 0, time.perf_counter()
        return row

    while step < args.max_steps:
        elapsed = elapsed_before + time.perf_counter() - start_time
        if budget_s is not None and elapsed >= budget_s:
            break
        # the whole step (all ranks, all micro-batches) is collated and masked at once, so neither the number of
        # processes nor gradient accumulation changes which tokens are masked
        step_size = global_batch * args.gradient_accumulation_steps
        batch = collate([train_data[i] for i in order.take(step * step_size, step_size)])
        n_labels = int((batch["labels"] != -100).sum())  # over the global step
        step_loss = 0.0
        for k in range(args.gradient_accumulation_steps):
            offset = k * global_batch + dist.rank * rows_per_rank
            local = _to(batch, dist.device, slice(offset, offset + rows_per_rank))
            last = k == args.gradient_accumulation_steps - 1
            sync = ddp_model.no_sync() if (dist.world_size > 1 and not last) else nullcontext()
            with sync, _autocast(args.bf16, dist.device):
                out = ddp_model(**local)
            n_local = int(out.labelled_positions.sum())
            # token-mean over the whole global step; DDP averages gradients over ranks, hence x world_size
            loss = out.loss * (n_local / max(1, n_labels)) * dist.world_size
            with sync:
                loss.backward()
            step_loss += float(out.loss.detach()) * n_local / max(1, n_labels)
            window_tokens += int(local["attention_mask"].sum())
        step_loss = dist.sum(step_loss)
        if not math.isfinite(step_loss):
            raise TrainingError(f"loss is {step_loss} at step {step + 1}: lower --learning_rate or raise "
                                f"--warmup_steps, or resume from the last checkpoint")
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        decay_steps = max(1, args.max_steps - args.warmup_steps)
        decay = (step - args.warmup_steps) / decay_steps
        if budget_s is not None:
            decay = max(decay, elapsed / budget_s)
        lr = args.learning_rate * lr_factor(step, args.warmup_steps, decay, args.lr_scheduler_type)
        set_learning_rate(optimizer, lr)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        window_loss += step_loss
        window_steps += 1
        progress.update(1)

        if step % args.logging_steps == 0 or step == args.max_steps:
            result = log_window(step, lr)
        if valid_data is not None and args.eval_steps and step % args.eval_steps == 0 and dist.is_main:
            ev = evaluate_mlm(model, valid_data, tokenizer, args.per_device_eval_batch_size,
                              max_samples=args.max_eval_samples, bf16=args.bf16, device=dist.device)
            with metrics_file.open("a") as f:
                f.write(json.dumps({"step": step, **{f"eval_{k}": v for k, v in ev.items()}}) + "\n")
        if args.save_steps and step % args.save_steps == 0 and dist.is_main:
            state = {"optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                     "collate_rng": collate.generator.get_state(), "step": step,
                     "elapsed": elapsed_before + time.perf_counter() - start_time,
                     "samples_seen": step * global_batch * args.gradient_accumulation_steps}
            save_checkpoint(output_dir, step, model, tokenizer, state, keep=args.save_total_limit)
    if window_steps:  # stopped by the time budget between two logging steps
        result = log_window(step, lr)
    progress.close()

    final = {"step": step, "train_loss": result.get("loss")}
    if valid_data is not None and dist.is_main:
        ev = evaluate_mlm(model, valid_data, tokenizer, args.per_device_eval_batch_size,
                          max_samples=args.max_eval_samples, bf16=args.bf16, device=dist.device)
        final.update({f"eval_{k}": v for k, v in ev.items()})
        with metrics_file.open("a") as f:
            f.write(json.dumps(final) + "\n")
    if dist.is_main:
        model.save_pretrained(output_dir, tokenizer=tokenizer)
        if metrics_file.exists():
            plot_loss_curve(metrics_file, output_dir / "loss_curve.png")
    dist.barrier()
    return final
