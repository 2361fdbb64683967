"""Fill-mask inference, shaped like `transformers.pipeline("fill-mask")`: `score`, `token`, `token_str`, `sequence`.

The vocabulary projection runs only at `[MASK]` positions (a (N, H) x (H, V) product instead of (B*T, H) x (H, V)).
"""

from __future__ import annotations

import torch

from unmask.data.collate import pad_batch


def _check(text: str, ids: list[int], tokenizer, max_length: int) -> None:
    if not isinstance(text, str) or not text.strip():
        raise ValueError("empty text: give a sentence with at least one mask token")
    mask = tokenizer.special_tokens.get("mask_token", "[MASK]")
    if tokenizer.mask_token_id not in ids:
        raise ValueError(f"no {mask} in {text!r}: write {mask} where the model should fill in a word")
    if len(ids) > max_length:
        raise ValueError(f"input is {len(ids)} tokens, longer than the model's context of {max_length}; shorten it "
                         "(fill-mask does not truncate silently)")


@torch.inference_mode()
def fill_mask(model, tokenizer, texts: str | list[str], top_k: int = 5, batch_size: int = 32):
    """Top-k fillers for every mask token. One text -> as the HF pipeline: a list of dicts for one mask, a list of
    such lists for several; a list of texts -> a list of those."""
    single = isinstance(texts, str)
    texts = [texts] if single else list(texts)
    if not texts:
        raise ValueError("no texts given")
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    encodings = tokenizer.encode_batch(texts)
    max_length = model.config.max_position_embeddings
    for text, enc in zip(texts, encodings):
        _check(text, enc.ids, tokenizer, max_length)
    model.eval()
    results = []
    for start in range(0, len(texts), batch_size):
        chunk = encodings[start : start + batch_size]
        ids, attention_mask = pad_batch([e.ids for e in chunk], tokenizer.pad_token_id)
        types, _ = pad_batch([e.type_ids for e in chunk], 0)
        at_mask = ids == tokenizer.mask_token_id  # (B, T)
        # labelling the masks makes the model run its vocabulary projection there only (sparse prediction)
        out = model(ids, attention_mask, types, labels=torch.where(at_mask, ids, -100))
        at_mask_row = at_mask[out.predicted_positions]  # (M,): the rows at a mask; the rest only round M up
        probs = out.logits[at_mask_row].float().softmax(-1)  # (N, V), masks in row-major order
        top = probs.topk(min(top_k, probs.shape[-1]))
        rows, cols = at_mask.nonzero(as_tuple=True)
        per_text: list[list] = [[] for _ in chunk]
        masks_in_row = at_mask.sum(1).tolist()
        for n, (row, col) in enumerate(zip(rows.tolist(), cols.tolist())):
            original = chunk[row].ids
            # as the HF pipeline: special tokens are dropped from `sequence` only when there is one mask
            skip_special = masks_in_row[row] == 1
            candidates = []
            for score, token in zip(top.values[n].tolist(), top.indices[n].tolist()):
                filled = original[:col] + [token] + original[col + 1 :]
                candidates.append({"score": score, "token": token,
                                   "token_str": tokenizer.decode([token], skip_special_tokens=False),
                                   "sequence": tokenizer.decode(filled, skip_special_tokens=skip_special)})
            per_text[row].append(candidates)
        results += [r[0] if len(r) == 1 else r for r in per_text]
    return results[0] if single else results
