"""Fill-mask, shaped like `transformers.pipeline("fill-mask")`: `score`, `token`, `token_str`, `sequence`.

The model predicts only at the `[MASK]` positions (sparse prediction: a (M, H) x (H, V) product instead of
(B*T, H) x (H, V)).
"""

from __future__ import annotations

from typing import Sequence

import torch
from tokenizers import Encoding

from unmask.errors import UsageError
from unmask.models.outputs import IGNORE_INDEX
from unmask.pipelines.batching import run_batches


def check_fill_mask(text, ids: list[int], tokenizer, max_length: int) -> None:
    if not isinstance(text, str) or not text.strip():
        raise UsageError("empty text: give a sentence with at least one mask token")
    mask = tokenizer.special_tokens.get("mask_token", "[MASK]")
    if tokenizer.mask_token_id not in ids:
        raise UsageError(f"no {mask} in {text!r}: write {mask} where the model should fill in a word")
    if len(ids) > max_length:
        raise UsageError(f"input is {len(ids)} tokens, longer than the model's context of {max_length}; shorten it "
                         "(fill-mask does not truncate silently)")


def fill_mask(model, tokenizer, texts: str | list[str], top_k: int = 5, batch_size: int = 32):
    """Top-k fillers for every mask token. One text -> as the HF pipeline: a list of dicts for one mask, a list of
    such lists for several; a list of texts -> a list of those."""
    single = isinstance(texts, str)
    texts = [texts] if single else list(texts)
    if not texts:
        raise UsageError("no texts given")
    encodings = tokenizer.encode_batch(texts)
    for text, encoding in zip(texts, encodings):
        check_fill_mask(text, encoding.ids, tokenizer, model.config.max_position_embeddings)
    results = fill_mask_tokens(model, tokenizer, encodings, top_k, batch_size)
    return results[0] if single else results


def fill_mask_tokens(model, tokenizer, encodings: Sequence[Encoding], top_k: int = 5, batch_size: int = 32) -> list:
    """`fill_mask` for texts tokenized already (and checked: each has a mask and fits the context)."""
    if top_k < 1:
        raise UsageError(f"top_k must be at least 1, got {top_k}")
    mask_id = tokenizer.mask_token_id

    def forward(input_ids, attention_mask, token_type_ids):
        at_mask = input_ids == mask_id  # (B, T)
        labels = torch.where(at_mask, input_ids, IGNORE_INDEX)  # the labelled positions are where it predicts
        out = model(input_ids, attention_mask, token_type_ids, labels=labels, sparse_prediction=True)
        probs = out.logits[at_mask[out.predicted_positions]].float().softmax(-1)  # (masks, V), row-major
        top = probs.topk(min(top_k, probs.shape[-1]))
        per_row: list[list] = [[] for _ in range(len(input_ids))]
        rows, cols = at_mask.nonzero(as_tuple=True)
        for n, (row, col) in enumerate(zip(rows.tolist(), cols.tolist())):
            original = input_ids[row, : int(attention_mask[row].sum())].tolist()
            # as the HF pipeline: special tokens are dropped from `sequence` only when there is one mask
            one_mask = int(at_mask[row].sum()) == 1
            per_row[row].append([_candidate(tokenizer, original, col, token, score, one_mask)
                                 for score, token in zip(top.values[n].tolist(), top.indices[n].tolist())])
        return [r[0] if len(r) == 1 else r for r in per_row]

    return run_batches(model, [e.ids for e in encodings], forward, tokenizer.pad_token_id, batch_size,
                       [e.type_ids for e in encodings])


def _candidate(tokenizer, ids: list[int], position: int, token: int, score: float, skip_special: bool) -> dict:
    filled = ids[:position] + [token] + ids[position + 1 :]
    return {"score": score, "token": token, "token_str": tokenizer.decode([token], skip_special_tokens=False),
            "sequence": tokenizer.decode(filled, skip_special_tokens=skip_special)}
