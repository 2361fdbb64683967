"""Predictions of fine-tuned heads, shaped like the HF pipelines: classification `[{label, score}]`, reranking
`[{index, score}]` (best first, as text-embeddings-inference answers). Inputs longer than the context are read in
overlapping windows by default (`truncation`, see data/windows.py)."""

from __future__ import annotations

import torch

from unmask.data.windows import make_windows, mean_by_owner
from unmask.tasks.classify import ClassificationData


def window_logits(model, tokenizer, inputs: list, truncation: str, stride: int | None,
                   batch_size: int = 32) -> torch.Tensor:
    """(inputs, labels) logits; an input longer than the context is read in windows whose logits are averaged."""
    from unmask.tasks.classify import predict_logits

    if not inputs:
        raise ValueError("no texts given")
    for item in inputs:
        parts = item if isinstance(item, tuple) else (item,)
        if any(not isinstance(p, str) or not p.strip() for p in parts):
            raise ValueError("empty text")
    encodings = [(e.ids, e.type_ids) for e in tokenizer.encode_batch(inputs)]
    windows = make_windows(encodings, model.config.max_position_embeddings, truncation, stride)
    data = ClassificationData(windows.input_ids, windows.token_type_ids, [0] * len(windows))
    logits = predict_logits(model, data, tokenizer.pad_token_id, batch_size)
    return torch.from_numpy(mean_by_owner(logits, windows.owner, len(inputs)))


def predict_classify(model, tokenizer, texts: list[str], top_k: int = 1, truncation: str = "chunk",
                     stride: int | None = None) -> list[list[dict]]:
    """Per text, the `top_k` labels with their probabilities (a regression head gives its score)."""
    logits = window_logits(model, tokenizer, list(texts), truncation, stride)
    if model.config.num_labels == 1:
        return [[{"label": model.config.id2label.get(0, "score"), "score": float(v)}] for v in logits[:, 0]]
    probs = logits.softmax(-1)
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    return [[{"label": model.config.id2label[int(i)], "score": float(p)} for p, i in zip(values, indices)]
            for values, indices in zip(top.values, top.indices)]


def predict_rerank(model, tokenizer, query: str, documents: list[str], truncation: str = "chunk",
                   stride: int | None = None) -> list[dict]:
    """Score every (query, document) pair with a cross-encoder; best first. A long document is read in windows
    (the query in each), their logits averaged."""
    logits = window_logits(model, tokenizer, [(query, d) for d in documents], truncation, stride)
    scores = logits[:, 0] if model.config.num_labels == 1 else logits.softmax(-1)[:, -1]
    ranked = sorted(range(len(documents)), key=lambda i: -float(scores[i]))
    return [{"index": i, "score": float(scores[i])} for i in ranked]
