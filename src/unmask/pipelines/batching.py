"""The one batching loop of inference: token-id sequences in, one result per sequence out, in input order."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from unmask.data.collate import pad_batch
from unmask.errors import UsageError
from unmask.progress import progress

# forward(input_ids, attention_mask, token_type_ids) -> one result per row of the (B, T) batch
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], Sequence]


def run_batches(model: torch.nn.Module, input_ids: Sequence[Sequence[int]], forward: Forward, pad_token_id: int,
                batch_size: int = 32, token_type_ids: Sequence[Sequence[int]] | None = None,
                show_progress: bool = False) -> list:
    """Run `forward` over `input_ids` in batches of `batch_size`, longest first, and return its results in input
    order. Batches are formed by length, so each one's sequences are alike and memory peaks in the first batch;
    they go to the model's device. The model runs in eval mode (no dropout, even mid-training: evaluation calls
    this) under inference mode, and goes back to the mode it was in."""
    if batch_size < 1:
        raise UsageError(f"batch_size must be at least 1, got {batch_size}")
    order = sorted(range(len(input_ids)), key=lambda i: -len(input_ids[i]))
    results: list = [None] * len(input_ids)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in progress(range(0, len(order), batch_size), desc="inference", unit="batch",
                                  disable=not show_progress):
                rows = order[start : start + batch_size]
                ids, attention_mask = pad_batch([input_ids[i] for i in rows], pad_token_id)
                types = None if token_type_ids is None else pad_batch([token_type_ids[i] for i in rows], 0)[0]
                ids, attention_mask = ids.to(device), attention_mask.to(device)
                types = None if types is None else types.to(device)
                for row, result in zip(rows, forward(ids, attention_mask, types)):
                    results[row] = result
    finally:
        model.train(was_training)
    return results


def check_texts(texts: Sequence, noun: str = "input") -> list:
    """The inputs as a list; each a non-empty text or a pair of them (a clear error instead of an empty vector)."""
    if isinstance(texts, str):
        raise TypeError(f"expected a list of {noun}s; wrap a single one in a list")
    texts = list(texts)
    if not texts:
        raise UsageError(f"no {noun}s given")
    for i, item in enumerate(texts):
        for part in item if isinstance(item, tuple) else (item,):
            if not isinstance(part, str):
                raise TypeError(f"{noun} {i} is {type(part).__name__}, not text")
            if not part.strip():
                raise UsageError(f"{noun} {i} is empty")
    return texts
