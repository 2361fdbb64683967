"""Sparse (SPLADE) vectors from a masked-LM head: one weight per vocabulary entry, most of them zero.

    w[v] = max over the input's tokens t of log(1 + relu(logits[t, v]))

(SPLADE's max pooling; Formal et al. 2021). The head runs at the real tokens only (`sparse_prediction` with every
real token labelled), so a batch costs (real tokens, V) floats, not (B, T, V).
"""

from __future__ import annotations

from typing import Sequence

import torch

from unmask.models.outputs import IGNORE_INDEX
from unmask.pipelines.batching import run_batches


def splade_vectors(model, encodings: Sequence, pad_token_id: int, batch_size: int = 8) -> list[dict[int, float]]:
    """Per input, `{vocabulary id: weight}` of its non-zero weights, largest first."""

    def forward(input_ids, attention_mask, token_type_ids):
        labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)  # every real token is read
        out = model(input_ids, attention_mask, labels=labels, sparse_prediction=True)
        weights = torch.log1p(torch.relu(out.logits.float()))  # (M, V)
        rows = out.predicted_positions.nonzero()[:, 0]  # (M,) the sequence of each row
        pooled = torch.zeros(input_ids.shape[0], weights.shape[1], dtype=weights.dtype, device=weights.device)
        pooled.scatter_reduce_(0, rows[:, None].expand_as(weights), weights, reduce="amax")  # (B, V)
        return [_as_dict(row) for row in pooled.cpu()]

    return run_batches(model, [e.ids for e in encodings], forward, pad_token_id, batch_size,
                       [e.type_ids for e in encodings])


def _as_dict(weights: torch.Tensor) -> dict[int, float]:
    nonzero = weights.nonzero()[:, 0]
    order = torch.argsort(weights[nonzero], descending=True, stable=True)
    return {int(i): float(weights[i]) for i in nonzero[order]}
