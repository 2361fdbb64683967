"""Resumable checkpoints: `checkpoint-N/` holds the exported model (HF layout) and, beside it, `training_state.pt`
with what resuming needs (optimizer, RNG states, step, data position, elapsed time). Never mixed into the export.

A checkpoint is built in a temp directory, its files flushed to disk, then renamed into place, so a run killed
mid-save (or a full disk) leaves the previous checkpoint intact and no half checkpoint under a checkpoint's name;
`list_checkpoints` only ever sees complete ones, and a resume falls back past one that cannot be read.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import warnings
from pathlib import Path

import torch

from unmask.errors import CheckpointError, TrainingError, UsageError
from unmask.hub import WEIGHTS_NAME, read_weights
from unmask.io import atomic_write

STATE_NAME = "training_state.pt"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_STALE = ("checkpoint-*.tmp*", ".*.tmp*")  # what a run killed mid-save leaves: temp checkpoints, temp files
_RUN_FILES = ("checkpoint-*", "metrics.jsonl", "tokenizer")  # what a new run must not mistake for its own


def prepare_output_dir(output_dir: Path, resuming: bool, overwrite: bool) -> None:
    """Create the output directory and clear what killed runs left in it. A new run refuses a directory that holds
    files already (another run's checkpoints would be taken for its own), unless `overwrite`, which removes the
    previous run's checkpoints, metrics and trained tokenizer first."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for pattern in _STALE:
        for stale in output_dir.glob(pattern):
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    if resuming:
        return
    found = sorted(p.name for p in output_dir.iterdir())
    if found and not overwrite:
        shown = ", ".join(found[:4]) + (" ..." if len(found) > 4 else "")
        raise UsageError(f"--output_dir {output_dir} is not empty ({shown}): pass --overwrite_output_dir to start a "
                         "new run there, or --resume_from_checkpoint latest to continue the one it holds")
    for pattern in _RUN_FILES:
        for old in output_dir.glob(pattern):
            shutil.rmtree(old) if old.is_dir() else old.unlink()


def save_checkpoint(output_dir: Path, step: int, model, tokenizer, state: dict, keep: int | None = 2) -> Path:
    final = Path(output_dir) / f"checkpoint-{step}"
    tmp = final.with_name(final.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, tokenizer=tokenizer)
        atomic_write(tmp / STATE_NAME, lambda path: torch.save(state, path))
        _flush(tmp)
    except (OSError, RuntimeError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if _disk_full(e):
            previous = list_checkpoints(output_dir)
            intact = f"{previous[-1].name} is intact" if previous else "no earlier checkpoint exists"
            raise TrainingError(f"no space left on device writing {final.name} in {output_dir}: {intact}; free "
                                "space and resume with --resume_from_checkpoint latest") from e
        raise
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _fsync(final.parent)
    if keep:
        for old in list_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _disk_full(error: BaseException) -> bool:
    """ENOSPC, or torch.save's way of saying it ("enforce fail at inline_container.cc ... unexpected pos")."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error)
    return "No space left" in text or ("enforce fail" in text and "inline_container" in text)


def _flush(directory: Path) -> None:
    """Every file of a directory on disk, before the rename that publishes it (a crash then never publishes a
    checkpoint whose data is still in the page cache only)."""
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync(directory)


def _fsync(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(output_dir: Path) -> list[Path]:
    found = [(int(m.group(1)), p) for p in Path(output_dir).glob("checkpoint-*")
             if (m := _CHECKPOINT.match(p.name)) and (p / STATE_NAME).exists()]
    return [p for _, p in sorted(found)]


def load_training_state(checkpoint: Path) -> dict:
    path = Path(checkpoint) / STATE_NAME
    if not path.exists():
        raise CheckpointError(f"{path}: missing; {checkpoint} is not a resumable checkpoint")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: empty (0 bytes): the save that wrote it did not finish")
    try:  # weights_only: tensors, numbers, strings and containers only
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{path}: cannot be loaded, the file is damaged ({type(e).__name__}: {e})") from e


def resume_point(output_dir: Path, asked: str) -> tuple[Path, dict]:
    """The checkpoint to continue from and its training state: `asked` itself, or for "latest" the newest one of
    `output_dir` that reads whole (a damaged newer one is skipped, and said so)."""
    if asked != "latest":
        checkpoint = Path(asked)
        _check_weights(checkpoint)
        return checkpoint, load_training_state(checkpoint)
    candidates = list_checkpoints(output_dir)
    if not candidates:
        raise TrainingError(f"--resume_from_checkpoint latest: no complete checkpoint in {output_dir}")
    for checkpoint in reversed(candidates):
        try:
            _check_weights(checkpoint)
            return checkpoint, load_training_state(checkpoint)
        except CheckpointError as e:
            warnings.warn(f"{checkpoint.name} cannot be resumed from ({e}); trying the one before it", stacklevel=2)
    raise TrainingError(f"--resume_from_checkpoint latest: none of the checkpoints in {output_dir} can be read "
                        f"({', '.join(c.name for c in candidates)})")


def _check_weights(checkpoint: Path) -> None:
    if not (checkpoint / WEIGHTS_NAME).exists():
        raise CheckpointError(f"{checkpoint / WEIGHTS_NAME}: missing")
    read_weights(checkpoint)  # raises CheckpointError on a damaged file
