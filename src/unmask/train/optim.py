"""Optimizer and learning-rate schedule, shared by pretraining and fine-tuning."""

from __future__ import annotations

import math

import torch

from unmask.errors import UsageError
from unmask.train.args import SCHEDULES


def param_groups(model: torch.nn.Module, weight_decay: float, head_lr_scale: float = 1.0) -> list[dict]:
    """AdamW groups: weight decay on matrices only, none on biases and LayerNorm (BERT's recipe). The head's own
    parameters (outside the encoder, `base_model_prefix`) carry `lr_scale` = `head_lr_scale`."""
    prefix = (getattr(model, "base_model_prefix", None) or "") + "."
    groups: dict[tuple[bool, bool], list] = {}
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:  # tied parameters appear once, under the encoder's name
            continue
        seen.add(id(p))
        decays = not (p.dim() < 2 or "LayerNorm" in name or "norm" in name)
        head = prefix != "." and not name.startswith(prefix)
        groups.setdefault((decays, head and head_lr_scale != 1.0), []).append(p)
    return [{"params": params, "weight_decay": weight_decay if decays else 0.0,
             "lr_scale": head_lr_scale if scaled else 1.0} for (decays, scaled), params in groups.items()]


def make_optimizer(model: torch.nn.Module, learning_rate: float, weight_decay: float = 0.01,
                   betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                   head_lr_scale: float = 1.0) -> torch.optim.AdamW:
    # fused: one kernel per parameter for the whole update; the foreach path spends a large share of a CPU
    # fine-tuning step in its sqrt pass (BENCHMARKS.md)
    return torch.optim.AdamW(param_groups(model, weight_decay, head_lr_scale), lr=learning_rate, betas=betas,
                             eps=eps, fused=True)


def lr_factor(step: int, warmup_steps: int, decay_progress: float, schedule: str = "linear",
              decay_ratio: float = 0.1) -> float:
    """Multiplier of the peak learning rate: linear warmup over `warmup_steps`, then decay to 0 as
    `decay_progress` goes from 0 to 1 (the fraction of the post-warmup steps, or of a wall-clock budget, used).
    `warmup_stable_decay` holds the peak and decays linearly over the last `decay_ratio` of that progress (as
    ModernBERT trains: a run resumed with more steps extends its stable phase)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    rest = min(1.0, max(0.0, decay_progress))
    if schedule == "linear":
        return 1.0 - rest
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * rest))
    if schedule == "constant":
        return 1.0
    if schedule == "warmup_stable_decay":
        return min(1.0, (1.0 - rest) / decay_ratio) if decay_ratio > 0 else 1.0
    raise UsageError(f"unknown lr schedule {schedule!r} ({', '.join(SCHEDULES)})")


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
