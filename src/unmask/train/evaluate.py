"""Every evaluation: masked-LM and ELECTRA on held-out text, classification and tagging on labelled files, STS and
BEIR retrieval for sentence encoders. Each returns a dict of metrics (named without the `eval_` prefix the training
loop adds).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from unmask.data.collate import MLMCollator
from unmask.data.labelled import ClassificationData, RankingData, TaggingData, join_pair
from unmask.data.pretraining import PackedDataset
from unmask.data.readers import read_beir
from unmask.errors import TrainingError
from unmask.metrics import entity_scores, macro_f1, pearson, retrieval_metrics, spearman
from unmask.models.outputs import IGNORE_INDEX
from unmask.objectives.electra import ElectraPretrainer
from unmask.pipelines.bm25 import BM25
from unmask.pipelines.classify import logits_of, relevance_logit
from unmask.pipelines.search import InvertedIndex, exact_search
from unmask.pipelines.sparse import sparse_encode
from unmask.pipelines.tag import predict_tags
from unmask.tokenizer import Tokenizer
from unmask.train.loop import autocast, to_device


def _evaluation_batches(model, dataset: PackedDataset, tokenizer: Tokenizer, batch_size: int,
                        mlm_probability: float, max_samples: int | None, bf16: bool, seed: int, device,
                        model_kwargs: dict):
    """(batch, output) over the validation data, masked with a fixed seed (comparable across runs and steps);
    the model is in eval mode, without gradients, and the global RNG (ELECTRA's sampling) is restored after."""
    was_training = model.training
    model.eval()
    collate = MLMCollator.from_tokenizer(tokenizer, mlm_probability=mlm_probability, seed=seed)
    n = len(dataset) if max_samples is None else min(len(dataset), max_samples)
    with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for start in range(0, n, batch_size):
            batch = to_device(collate([dataset[i] for i in range(start, min(n, start + batch_size))]), device)
            with autocast(bf16, device):
                yield batch, model(**batch, **model_kwargs)
    model.train(was_training)


def evaluate_mlm(model, dataset: PackedDataset, tokenizer: Tokenizer, batch_size: int = 64,
                 mlm_probability: float = 0.15, max_samples: int | None = None, bf16: bool = False,
                 seed: int = 0, device: torch.device = torch.device("cpu")) -> dict:
    """Masked-LM loss, masked-token accuracy and perplexity."""
    loss_sum, correct, count = 0.0, 0, 0
    for batch, out in _evaluation_batches(model, dataset, tokenizer, batch_size, mlm_probability, max_samples,
                                          bf16, seed, device, {"sparse_prediction": True}):
        targets = batch["labels"][out.predicted_positions]  # (M,), -100 at the rows no label is on
        scored = targets != IGNORE_INDEX
        k = int(scored.sum())
        if k:
            loss_sum += float(out.loss) * k
            correct += int((out.logits.argmax(-1)[scored] == targets[scored]).sum())
            count += k
    if count == 0:
        raise TrainingError("the validation data has no maskable tokens")
    loss = loss_sum / count
    return {"loss": loss, "accuracy": correct / count, "perplexity": math.exp(min(loss, 50.0)), "tokens": count}


def evaluate_electra(model: ElectraPretrainer, dataset: PackedDataset, tokenizer: Tokenizer, batch_size: int = 64,
                     mlm_probability: float = 0.15, max_samples: int | None = None, bf16: bool = False,
                     seed: int = 0, device: torch.device = torch.device("cpu")) -> dict:
    """The generator's MLM loss and accuracy; the discriminator's detection loss, accuracy over real tokens, and
    recall of the replaced ones (the rare class: guessing 'original' everywhere scores ~93% accuracy)."""
    sums = dict.fromkeys(["mlm", "correct", "masked", "rtd", "rtd_correct", "tokens", "found", "replaced"], 0.0)
    for batch, out in _evaluation_batches(model, dataset, tokenizer, batch_size, mlm_probability, max_samples,
                                          bf16, seed, device, {}):
        masked = batch["labels"] != IGNORE_INDEX
        real = batch["attention_mask"].bool()
        k, t = int(masked.sum()), int(real.sum())
        guess = out.rtd_logits > 0  # (B, T)
        sums["mlm"] += float(out.mlm_loss) * k
        targets = batch["labels"][out.generator_positions]  # (M,), -100 at the rows no label is on
        sums["correct"] += int((out.generator_logits.argmax(-1) == targets)[targets != IGNORE_INDEX].sum())
        sums["masked"] += k
        sums["rtd"] += float(out.rtd_loss) * t
        sums["rtd_correct"] += int((guess == out.replaced)[real].sum())
        sums["tokens"] += t
        sums["found"] += int((guess & out.replaced).sum())
        sums["replaced"] += int(out.replaced.sum())
    if sums["masked"] == 0:
        raise TrainingError("the validation data has no maskable tokens")
    return {"generator_loss": sums["mlm"] / sums["masked"], "generator_accuracy": sums["correct"] / sums["masked"],
            "rtd_loss": sums["rtd"] / sums["tokens"], "rtd_accuracy": sums["rtd_correct"] / sums["tokens"],
            "rtd_recall": sums["found"] / max(1, sums["replaced"]), "tokens": int(sums["tokens"])}


def evaluate_sts(encoder, first: list[str], second: list[str], scores: np.ndarray, batch_size: int = 64,
                 dimensions: int | None = None) -> dict:
    """Cosine similarity of the two sentences' embeddings (their leading `dimensions`) against the gold scores."""
    unique = list(dict.fromkeys(first + second))  # encode each distinct sentence once
    vectors = encoder.encode(unique, batch_size=batch_size, normalize=True, dimensions=dimensions)
    index = {s: i for i, s in enumerate(unique)}
    a = vectors[[index[s] for s in first]]
    b = vectors[[index[s] for s in second]]
    cosine = (a * b).sum(1)
    return {"spearman": spearman(cosine, scores), "pearson": pearson(cosine, scores), "pairs": len(scores)}


Reranker = Callable[[list[str], list[str], list[list[int]]], list[list[int]]]  # queries, documents, candidates


def evaluate_bm25(corpus, queries, qrels, rerank: Reranker | None = None) -> dict:
    """`evaluate_retrieval`'s metrics for BM25 (k1 0.9, b 0.4): the lexical baseline, no model."""
    doc_ids, doc_texts, query_ids, query_texts, relevance = read_beir(corpus, queries, qrels)
    top = BM25(doc_texts).search(query_texts, 100)
    return _ranking_metrics(top, doc_ids, doc_texts, query_ids, query_texts, relevance, rerank)


def evaluate_retrieval(encoder, corpus, queries, qrels, batch_size: int = 64, truncation: str = "chunk",
                       stride: int | None = None, dimensions: int | None = None,
                       rerank: Reranker | None = None) -> dict:
    """nDCG@10, recall@100 and MRR@10 of exact search (on the vectors' leading `dimensions`); documents longer than
    max_seq_length are embedded as the mean of their windows (`truncation="truncate"` cuts them, as
    sentence-transformers does)."""
    doc_ids, doc_texts, query_ids, query_texts, relevance = read_beir(corpus, queries, qrels)
    options = {"batch_size": batch_size, "truncation": truncation, "stride": stride, "dimensions": dimensions}
    doc_vectors, query_vectors = encoder.encode(doc_texts, **options), encoder.encode(query_texts, **options)
    top = exact_search(query_vectors, doc_vectors, k=100)[0]
    return _ranking_metrics(top, doc_ids, doc_texts, query_ids, query_texts, relevance, rerank)


def evaluate_sparse_retrieval(model, tokenizer, corpus, queries, qrels, batch_size: int = 8,
                              truncation: str = "chunk", stride: int | None = None,
                              rerank: Reranker | None = None) -> dict:
    """`evaluate_retrieval`'s metrics for SPLADE vectors of a masked-LM, searched through an inverted index."""
    doc_ids, doc_texts, query_ids, query_texts, relevance = read_beir(corpus, queries, qrels)
    options = {"batch_size": batch_size, "truncation": truncation, "stride": stride}
    index = InvertedIndex(sparse_encode(model, tokenizer, doc_texts, **options))
    top = index.search(sparse_encode(model, tokenizer, query_texts, **options), 100)
    return _ranking_metrics(top, doc_ids, doc_texts, query_ids, query_texts, relevance, rerank)


def _ranking_metrics(top, doc_ids, doc_texts, query_ids, query_texts, relevance, rerank: Reranker | None) -> dict:
    """The metrics of the first stage's top 100 per query; with `rerank` (a cross-encoder re-ordering them), the
    metrics of its order, and the first stage's nDCG@10 beside them."""
    metrics = retrieval_metrics([[doc_ids[j] for j in row] for row in top], query_ids, relevance)
    if rerank is None:
        return metrics
    reranked = rerank(query_texts, doc_texts, [list(row) for row in top])
    return {**retrieval_metrics([[doc_ids[j] for j in row] for row in reranked], query_ids, relevance),
            "retriever_ndcg@10": metrics["ndcg@10"], "retriever_mrr@10": metrics["mrr@10"]}


def evaluate_classification(model, data: ClassificationData, pad_token_id: int, batch_size: int = 64,
                            show_progress: bool = False) -> dict:
    """Accuracy and macro-F1, or for a one-label (regression) model Spearman, Pearson and MSE."""
    logits = logits_of(model, data.input_ids, data.token_type_ids, pad_token_id, batch_size, show_progress)
    gold = np.asarray(data.labels)
    if model.config.num_labels == 1:  # regression
        scores = logits[:, 0]
        return {"spearman": spearman(scores, gold), "pearson": pearson(scores, gold),
                "mse": float(((scores - gold) ** 2).mean()), "examples": len(gold)}
    predicted = logits.argmax(-1)
    return {"accuracy": float((predicted == gold).mean()),
            "macro_f1": macro_f1(gold, predicted, model.config.num_labels), "examples": len(gold)}


def evaluate_ranking(model, data: RankingData, pad_token_id: int, batch_size: int = 64,
                     show_progress: bool = False) -> dict:
    """A reranker on each anchor's own candidates: accuracy (its positive scored above every hard negative) and MRR
    of the positive among them."""
    pairs = [join_pair(a, d, data.cls_id, data.sep_id, data.max_length)
             for a, row in zip(data.anchors, data.candidates) for d in row]
    logits = logits_of(model, [ids for ids, _ in pairs], [types for _, types in pairs], pad_token_id, batch_size,
                       show_progress)
    scores = relevance_logit(logits).reshape(len(data), -1)  # (rows, 1 + k): the positive first
    above = (scores[:, 1:] >= scores[:, :1]).sum(1)  # hard negatives scored at or above the positive
    return {"accuracy": float((above == 0).mean()), "mrr": float((1.0 / (1 + above)).mean()), "examples": len(data)}


def evaluate_tagging(model, data: TaggingData, pad_token_id: int, batch_size: int = 64,
                     show_progress: bool = False) -> dict:
    """Entity precision / recall / F1 (and per type), word accuracy."""
    predicted = predict_tags(model, data, pad_token_id, batch_size, show_progress)
    scores = entity_scores(data.tags, predicted)
    words = sum(len(t) for t in data.tags)
    correct = sum(g == p for gs, ps in zip(data.tags, predicted) for g, p in zip(gs, ps))
    return {"precision": scores["precision"], "recall": scores["recall"], "f1": scores["f1"],
            "word_accuracy": correct / words, "sentences": len(data), "per_type": scores["per_type"]}


def evaluate_task(task: str, model, data, pad_token_id: int, batch_size: int = 64,
                  show_progress: bool = False) -> dict:
    """The metrics of a fine-tuned `classify`, `pair` or `tag` model on its labelled data."""
    if task == "tag":
        return evaluate_tagging(model, data, pad_token_id, batch_size, show_progress)
    if isinstance(data, RankingData):
        return evaluate_ranking(model, data, pad_token_id, batch_size, show_progress)
    return evaluate_classification(model, data, pad_token_id, batch_size, show_progress)
