"""Optimizer and learning-rate schedule, shared by pretraining and fine-tuning."""

from __future__ import annotations

import math
from typing import Callable

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


def allocate_state(optimizer: torch.optim.AdamW) -> Callable[[], None]:
    """Every parameter's gradient and AdamW moments, made now, before any activation, and kept from step to step
    (`zero_grad(set_to_none=False)`). Made lazily instead, they land amid the first step's activations and the
    gradients are freed and placed anew every step, so the heap that `keep_freed_memory` keeps fragments around them
    (more peak memory and slower steps, BENCHMARKS.md). The moments are laid out as AdamW's own first step makes
    them (and its `state_dict` saves them); a state already there (a resumed run's) is kept.

    Returns `settle`, to call once after the first backward: it frees the gradient (and moments) of every parameter
    that got no gradient, so AdamW skips it from then on as it would have (no weight decay on an unused pooler)."""
    touched, hooks = set(), []
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for p in params:
        p.grad = torch.zeros_like(p)
        hooks.append(p.register_post_accumulate_grad_hook(lambda q: touched.add(id(q))))
        if not optimizer.state[p]:
            optimizer.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                                  "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}

    def settle() -> None:
        for hook in hooks:
            hook.remove()
        for p in params:
            if id(p) not in touched:
                p.grad = None
                if not optimizer.state[p]["step"]:  # never stepped: no state, as if never allocated
                    del optimizer.state[p]
    return settle


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
