"""Predictions of fine-tuned heads, shaped like the HF pipelines: classification `[{label, score}]`, reranking
`[{index, score}]` (best first, as text-embeddings-inference answers)."""

from __future__ import annotations

import torch

from unmask.tasks.classify import ClassificationData


def _encode(model, tokenizer, inputs: list) -> ClassificationData:
    if not inputs:
        raise ValueError("no texts given")
    for item in inputs:
        parts = item if isinstance(item, tuple) else (item,)
        if any(not isinstance(p, str) or not p.strip() for p in parts):
            raise ValueError("empty text")
    encodings = tokenizer.encode_batch(inputs)
    limit = model.config.max_position_embeddings
    for enc in encodings:
        if len(enc.ids) > limit:
            raise ValueError(f"input is {len(enc.ids)} tokens, longer than the model's context of {limit}; "
                             "shorten it (nothing is truncated silently)")
    return ClassificationData([e.ids for e in encodings], [e.type_ids for e in encodings], [0] * len(encodings))


def _logits(model, tokenizer, data: ClassificationData, batch_size: int = 32) -> torch.Tensor:
    from unmask.tasks.classify import predict_logits

    return torch.from_numpy(predict_logits(model, data, tokenizer.pad_token_id, batch_size))


def predict_classify(model, tokenizer, texts: list[str], top_k: int = 1) -> list[list[dict]]:
    """Per text, the `top_k` labels with their probabilities (a regression head gives its score)."""
    logits = _logits(model, tokenizer, _encode(model, tokenizer, list(texts)))
    if model.config.num_labels == 1:
        return [[{"label": model.config.id2label.get(0, "score"), "score": float(v)}] for v in logits[:, 0]]
    probs = logits.softmax(-1)
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    return [[{"label": model.config.id2label[int(i)], "score": float(p)} for p, i in zip(values, indices)]
            for values, indices in zip(top.values, top.indices)]


def predict_rerank(model, tokenizer, query: str, documents: list[str]) -> list[dict]:
    """Score every (query, document) pair with a cross-encoder; best first."""
    logits = _logits(model, tokenizer, _encode(model, tokenizer, [(query, d) for d in documents]))
    scores = logits[:, 0] if model.config.num_labels == 1 else logits.softmax(-1)[:, -1]
    ranked = sorted(range(len(documents)), key=lambda i: -float(scores[i]))
    return [{"index": i, "score": float(scores[i])} for i in ranked]
