"""Gradient caching (GradCache; sentence-transformers' CachedMultipleNegativesRankingLoss): a contrastive batch of any
size at the memory of one mini-batch.

The embeddings are computed without a graph, a mini-batch of at most `token_budget` tokens at a time. The loss then
sees them through `_Replay`, whose backward recomputes each mini-batch with its graph (the same random state, so the
same dropout) and sends it its slice of the embeddings' gradient: the weights get exactly the gradient of the
uncached loss, and only one mini-batch's activations are alive at a time.

With `keep_last`, the last mini-batch keeps its graph instead, so it is computed once. Pass it only to the last call
before the loss: its graph is then the newest, which autograd backpropagates (and frees) before any replay starts.
"""

from __future__ import annotations

from typing import Callable

import torch


def token_chunks(attention_mask: torch.Tensor, token_budget: int) -> list[slice]:
    """Consecutive rows whose padded size (rows x their longest length) stays within the budget (one row at least)."""
    lengths = attention_mask.sum(dim=1).tolist()
    chunks, start, longest = [], 0, 0
    for row, length in enumerate(lengths):
        longest = max(longest, length)
        if row > start and (row - start + 1) * longest > token_budget:
            chunks.append(slice(start, row))
            start, longest = row, length
    return chunks + [slice(start, len(lengths))]


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, trigger: torch.Tensor, embeddings: torch.Tensor, replay: Callable) -> torch.Tensor:
        ctx.replay = replay
        return embeddings.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.replay(grad)
        return None, None, None


def cached_embeddings(embed: Callable, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      token_budget: int, keep_last: bool = False) -> torch.Tensor:
    """`embed(input_ids, attention_mask)` (N, H), computed a mini-batch at a time without a graph (but the last one
    with `keep_last`); its backward recomputes each such mini-batch and backpropagates into the weights."""
    chunks, states, parts = token_chunks(attention_mask, token_budget), [], []
    kept = chunks.pop() if keep_last else None
    autocast = torch.is_autocast_enabled(input_ids.device.type)
    with torch.no_grad():
        for rows in chunks:
            states.append(torch.get_rng_state())
            parts.append(embed(input_ids[rows], attention_mask[rows]))

    def replay(grad: torch.Tensor) -> None:
        for rows, state in zip(chunks, states):
            with torch.enable_grad(), torch.random.fork_rng(devices=[]), \
                    torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
                torch.set_rng_state(state)
                part = embed(input_ids[rows], attention_mask[rows])
            part.backward(grad[rows].to(part.dtype))

    cached = []
    if chunks:
        trigger = torch.zeros((), requires_grad=True)  # gives the output a backward to run
        cached = [_Replay.apply(trigger, torch.cat(parts), replay)]
    if kept is None:
        return cached[0]
    return torch.cat([*cached, embed(input_ids[kept], attention_mask[kept])])  # (N, H)
