"""Sparse (SPLADE) vectors from a masked-LM head: one weight per vocabulary entry, most of them zero.

    w[v] = max over the input's tokens t of log(1 + relu(logits[t, v])) = log(1 + relu(max over t of logits[t, v]))

(SPLADE's max pooling; Formal et al. 2021; the two forms are equal because log(1 + relu(x)) never decreases, and so
are their gradients). The head runs at the real tokens only (`sparse_prediction` without labels), so a batch costs
(real tokens, V) floats, not (B, T, V); taking each sequence's maximum of the logits first, training keeps no
(tokens, V) tensor for the backward, only the argmax of each vocabulary entry.
"""

from __future__ import annotations

from itertools import groupby
from typing import Sequence

import numpy as np
import torch

from unmask.data.windows import make_windows
from unmask.pipelines.batching import check_texts, run_batches
from unmask.pipelines.search import SparseVectors


def splade_pool(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
    """(B, V) SPLADE weights of a padded batch, differentiable (training reads the same function)."""
    out = model(input_ids, attention_mask, token_type_ids, sparse_prediction=True)  # logits at every real token
    logits = out.logits.float()  # (M, V): each sequence's rows in turn (row-major order)
    counts = out.predicted_positions.sum(dim=1).tolist()  # (B,) real tokens of each sequence
    top = [rows.max(dim=0).values if len(rows) else logits.new_zeros(logits.shape[1])
           for rows in logits.split(counts)]  # max's backward keeps only the argmax indices, (V,) a sequence
    return torch.log1p(torch.relu(torch.stack(top)))  # (B, V)


def lower_to_sparse(model, input_ids: Sequence[Sequence[int]], pad_token_id: int, terms: int = 30,
                    batch_size: int = 8) -> float:
    """Lower the masked-LM head's output bias by one constant, so that a typical token of `input_ids` has `terms`
    vocabulary entries above zero (of BERT's 30,522), and return the constant (0 where no more already are).

    Softmax ignores a constant added to every logit, so the masked LM predicts exactly as before; SPLADE's
    log(1 + relu) does not. A head whose logits centre near zero (one trained briefly, as a head new to a model)
    gives vectors over the whole vocabulary, and the FLOPS term would need thousands of steps to thin them."""
    bias = model.get_output_embeddings().bias
    if bias is None:
        return 0.0
    k = min(terms, model.config.vocab_size)

    def kth_largest(ids, attention_mask, types):  # (B,): each sequence's median over tokens
        out = model(ids, attention_mask, types, sparse_prediction=True)  # logits (M, V) at every real token
        kth = torch.topk(out.logits.float(), k, dim=1).values[:, -1]  # (M,)
        return [rows.median() for rows in kth.split(out.predicted_positions.sum(dim=1).tolist())]

    shift = float(torch.stack(run_batches(model, input_ids, kth_largest, pad_token_id, batch_size)).median())
    if shift <= 0:
        return 0.0
    with torch.no_grad():
        bias -= shift
    return shift


def splade_vectors(model, input_ids: Sequence[Sequence[int]], token_type_ids: Sequence[Sequence[int]],
                   pad_token_id: int, batch_size: int = 8) -> SparseVectors:
    """The SPLADE vector of each input that fits the context, its non-zero weights kept as arrays."""

    def forward(ids, attention_mask, types):
        rows = []
        for weights in splade_pool(model, ids, attention_mask, types).cpu().numpy():  # (V,) a sequence
            nonzero = np.flatnonzero(weights)
            rows.append((nonzero.astype(np.int32), weights[nonzero]))
        return rows

    rows = run_batches(model, input_ids, forward, pad_token_id, batch_size, token_type_ids)
    return SparseVectors.from_rows(rows, model.config.vocab_size)


def sparse_encode(model, tokenizer, texts: Sequence[str], batch_size: int = 8, truncation: str = "chunk",
                  stride: int | None = None, max_length: int | None = None) -> SparseVectors:
    """SPLADE vectors of texts of any length: one longer than `max_length` (default the context) is read in windows
    (data/windows.py) and its vector is the maximum over them, which is SPLADE's max over all its tokens."""
    context = model.config.max_position_embeddings
    encodings = tokenizer.encode_batch(check_texts(texts))
    windows = make_windows([(e.ids, e.type_ids) for e in encodings], min(max_length or context, context),
                           truncation, stride)
    per_window = splade_vectors(model, windows.input_ids, windows.token_type_ids, tokenizer.pad_token_id, batch_size)
    if len(per_window) == len(encodings):  # one window each
        return per_window
    by_input = groupby(range(len(per_window)), key=windows.owner.__getitem__)  # an input's windows come in turn
    rows = [_maximum([per_window.row(w) for w in group]) for _, group in by_input]
    return SparseVectors.from_rows(rows, per_window.width)


def _maximum(vectors: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The element-wise maximum of sparse vectors of non-negative weights: (dimensions ascending, weights)."""
    ids = np.concatenate([i for i, _ in vectors])
    weights = np.concatenate([w for _, w in vectors])
    order = np.lexsort((-weights, ids))  # by dimension, the largest weight first
    ids, weights = ids[order], weights[order]
    first = np.concatenate([[True], ids[1:] != ids[:-1]])
    return ids[first], weights[first]
