"""Resumable checkpoints: `checkpoint-N/` holds the exported model (HF layout) and, beside it, `training_state.pt`
with what resuming needs (optimizer, RNG states, step, data position, elapsed time). Never mixed into the export.

A checkpoint is built in a temp directory and renamed into place, so a run killed mid-save leaves no half
checkpoint; `latest_checkpoint` only ever sees complete ones.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch

from unmask.errors import CheckpointError
from unmask.io import atomic_write

STATE_NAME = "training_state.pt"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def save_checkpoint(output_dir: Path, step: int, model, tokenizer, state: dict, keep: int | None = 2) -> Path:
    final = Path(output_dir) / f"checkpoint-{step}"
    tmp = final.with_name(final.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, tokenizer=tokenizer)
    atomic_write(tmp / STATE_NAME, lambda path: torch.save(state, path))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    if keep:
        for old in list_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(output_dir: Path) -> list[Path]:
    found = [(int(m.group(1)), p) for p in Path(output_dir).glob("checkpoint-*")
             if (m := _CHECKPOINT.match(p.name)) and (p / STATE_NAME).exists()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(output_dir)
    return checkpoints[-1] if checkpoints else None


def load_training_state(checkpoint: Path) -> dict:
    path = Path(checkpoint) / STATE_NAME
    if not path.exists():
        raise CheckpointError(f"{path}: missing; {checkpoint} is not a resumable checkpoint")
    try:  # weights_only: tensors, numbers, strings and containers only
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{path}: cannot be loaded ({e})") from e
