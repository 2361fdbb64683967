"""Sequence classification, pair scoring and reranking, shaped like the HF pipeline and TEI: per input, labels with
scores, best first (`[{label, score}]`); per query, documents by relevance (`[{index, score}]`, best first).

A one-label model scores one number per input: a regression (an STS cross-encoder) or a relevance logit. Its score
is the raw logit for classification, and for reranking the sigmoid of it (as sentence-transformers' CrossEncoder and
TEI's /rerank), unless raw scores are asked for. Inputs longer than the context are read in overlapping windows by
default (`truncation`, see data/windows.py), their logits averaged.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from tokenizers import Encoding

from unmask.data.windows import make_windows, mean_by_owner
from unmask.pipelines.batching import check_texts, run_batches


def logits_of(model, input_ids: Sequence[Sequence[int]], token_type_ids: Sequence[Sequence[int]] | None,
              pad_token_id: int, batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
    """(N, num_labels) float32 logits of sequences that fit the context, in input order."""
    def forward(ids, attention_mask, types):
        return model(ids, attention_mask, types).logits.float().cpu().numpy()

    return np.stack(run_batches(model, input_ids, forward, pad_token_id, batch_size, token_type_ids, show_progress))


def window_logits(model, encodings: Sequence[Encoding], pad_token_id: int, truncation: str = "chunk",
                  stride: int | None = None, batch_size: int = 32, max_length: int | None = None,
                  show_progress: bool = False) -> np.ndarray:
    """(inputs, labels) logits of tokenized inputs; one longer than `max_length` (default and at most the context)
    is read in windows, logits averaged."""
    context = model.config.max_position_embeddings
    windows = make_windows([(e.ids, e.type_ids) for e in encodings], min(max_length or context, context),
                           truncation, stride)
    logits = logits_of(model, windows.input_ids, windows.token_type_ids, pad_token_id, batch_size, show_progress)
    return mean_by_owner(logits, windows.owner, len(encodings))


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-logits))


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def label_scores(logits: np.ndarray, id2label: dict[int, str], raw_scores: bool = False,
                 top_k: int | None = None, function: str | None = None) -> list[list[dict]]:
    """Per input, `{label, score}` best first (the `top_k` best): probabilities (a one-label model's sigmoid, as
    `/rerank`, TEI and sentence-transformers' `CrossEncoder` give it), or the logits when `raw_scores`. `function`
    (the `transformers` pipeline's `function_to_apply`: sigmoid, softmax or none) overrides that choice."""
    if function is None:
        function = "none" if raw_scores else "sigmoid" if logits.shape[1] == 1 else "softmax"
    scores = {"none": logits, "sigmoid": sigmoid(logits), "softmax": softmax(logits)}[function]
    k = logits.shape[1] if top_k is None else min(top_k, logits.shape[1])
    best = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # (inputs, k)
    return [[{"label": id2label.get(int(j), str(j)), "score": float(row[j])} for j in order]
            for row, order in zip(scores, best)]


def relevance(logits: np.ndarray, raw_scores: bool = False) -> np.ndarray:
    """(pairs,) relevance of a cross-encoder's logits: the sigmoid of a one-label model's logit, or the probability
    of the last class ("relevant") of a classifier; the logit itself with `raw_scores`."""
    if logits.shape[1] == 1:
        return logits[:, 0] if raw_scores else sigmoid(logits[:, 0])
    return logits[:, -1] if raw_scores else softmax(logits)[:, -1]


def relevance_logit(logits: np.ndarray) -> np.ndarray:
    """(pairs,) log-odds of relevance: a one-label model's logit; for a classifier, log p(last) - log(1 - p(last))
    (with two classes, the difference of the logits). A teacher's score for distillation."""
    if logits.shape[1] == 1:
        return logits[:, 0]
    rest = np.log(np.exp(logits[:, :-1] - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    return logits[:, -1] - rest


def ranked(scores: np.ndarray) -> list[dict]:
    """`[{index, score}]`, best first."""
    return [{"index": int(i), "score": float(scores[i])} for i in np.argsort(-scores, kind="stable")]


def predict_classify(model, tokenizer, texts: Sequence[str], top_k: int = 1, truncation: str = "chunk",
                     stride: int | None = None, raw_scores: bool = False) -> list[list[dict]]:
    """Per text (or (text, text) pair), the `top_k` labels with their probabilities (a one-label model: its score)."""
    encodings = tokenizer.encode_batch(check_texts(texts))
    logits = window_logits(model, encodings, tokenizer.pad_token_id, truncation, stride)
    return label_scores(logits, model.config.id2label or {}, raw_scores, top_k)


def predict_rerank(model, tokenizer, query: str, documents: Sequence[str], truncation: str = "chunk",
                   stride: int | None = None, raw_scores: bool = False) -> list[dict]:
    """Score every (query, document) pair with a cross-encoder; best first. A long document is read in windows
    (the query in each), their logits averaged."""
    encodings = tokenizer.encode_batch(check_texts([(query, d) for d in documents]))
    logits = window_logits(model, encodings, tokenizer.pad_token_id, truncation, stride)
    return ranked(relevance(logits, raw_scores))


def pair_scores(model, tokenizer, pairs: Sequence[tuple[str, str]], truncation: str = "chunk",
                max_length: int | None = None, batch_size: int = 32) -> np.ndarray:
    """(pairs,) a cross-encoder's relevance log-odds of (query, document) pairs, in one length-sorted pass: the
    scores of eval's reranker, of mine's rescoring and of distillation's teacher."""
    encodings = tokenizer.encode_batch(check_texts(pairs))
    return relevance_logit(window_logits(model, encodings, tokenizer.pad_token_id, truncation,
                                         batch_size=batch_size, max_length=max_length, show_progress=True))


def rerank_candidates(model, tokenizer, queries: Sequence[str], documents: Sequence[str],
                      candidates: Sequence[Sequence[int]], top_k: int = 100, truncation: str = "chunk",
                      max_length: int | None = None, batch_size: int = 32) -> list[list[int]]:
    """Per query, its candidate documents (indices, best first) with the first `top_k` re-ordered by the
    cross-encoder's relevance; the rest keep their place after them. Every pair is scored in one length-sorted pass."""
    pairs = [(queries[q], documents[d]) for q, row in enumerate(candidates) for d in row[:top_k]]
    scores = pair_scores(model, tokenizer, pairs, truncation, max_length, batch_size)
    out, start = [], 0
    for row in candidates:
        head = list(row[:top_k])
        order = np.argsort(-scores[start : start + len(head)], kind="stable")
        out.append([head[i] for i in order] + list(row[top_k:]))
        start += len(head)
    return out
