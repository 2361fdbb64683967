"""Embedding evaluation: STS (cosine vs gold scores, Spearman / Pearson) and BEIR-style retrieval (exact search).

STS files: the STS Benchmark release format (tab-separated genre, file, year, id, score, sentence1, sentence2; no
header), or any TSV with a header / JSONL with named columns. Retrieval: BEIR's `corpus.jsonl` (`_id`, `title`,
`text`), `queries.jsonl` (`_id`, `text`) and a qrels TSV (`query-id`, `corpus-id`, `score`, with a header).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from unmask.data.sources import DataError


def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties get their average rank (as scipy.stats.rankdata)."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(1, len(x) + 1)
    sorted_x = x[order]
    # average the ranks of each run of equal values
    boundaries = np.flatnonzero(np.diff(sorted_x) != 0) + 1
    for run in np.split(np.arange(len(x)), boundaries):
        if len(run) > 1:
            ranks[order[run]] = ranks[order[run]].mean()
    return ranks


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64) - np.mean(a), np.asarray(b, np.float64) - np.mean(b)
    return float((a * b).sum() / math.sqrt((a * a).sum() * (b * b).sum()))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return pearson(rankdata(np.asarray(a, np.float64)), rankdata(np.asarray(b, np.float64)))


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8-sig").splitlines()
    except FileNotFoundError as e:
        raise DataError(f"{path}: no such file") from e
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid UTF-8 (byte {e.start})") from e


def read_sts(path: str | Path, sentence1_column: str | None = None, sentence2_column: str | None = None,
             score_column: str | None = None) -> tuple[list[str], list[str], np.ndarray]:
    """Pairs and gold scores. Without column names the file is read as the STS Benchmark release."""
    path = Path(path)
    lines = [line for line in _read_lines(path) if line.strip()]
    if not lines:
        raise DataError(f"{path}: empty file")
    first, second, scores = [], [], []
    if sentence1_column is None:  # STS Benchmark: genre, file, year, id, score, s1, s2 [, sources]
        for n, line in enumerate(lines, start=1):
            parts = line.split("\t")
            if len(parts) < 7:
                raise DataError(f"{path}:{n}: expected 7 tab-separated fields (STS Benchmark format), got "
                                f"{len(parts)}; for other files pass --sentence1_column/--sentence2_column/"
                                "--score_column")
            try:
                scores.append(float(parts[4]))
            except ValueError as e:
                raise DataError(f"{path}:{n}: score {parts[4]!r} is not a number") from e
            first.append(parts[5])
            second.append(parts[6])
        return first, second, np.asarray(scores)
    columns = (sentence1_column, sentence2_column or "sentence2", score_column or "score")
    if path.name.endswith((".jsonl", ".json")):
        records = []
        for n, line in enumerate(lines, start=1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not JSON ({e.msg})") from e
    else:
        header = lines[0].split("\t")
        records = [dict(zip(header, line.split("\t"))) for line in lines[1:]]
    for n, record in enumerate(records, start=1):
        missing = [c for c in columns if c not in record]
        if missing:
            raise DataError(f"{path}: record {n} has no column {missing[0]!r} (found {sorted(record)})")
        first.append(str(record[columns[0]]))
        second.append(str(record[columns[1]]))
        scores.append(float(record[columns[2]]))
    return first, second, np.asarray(scores)


def evaluate_sts(encoder, first: list[str], second: list[str], scores: np.ndarray, batch_size: int = 64) -> dict:
    """Cosine similarity of the two sentences' embeddings against the gold scores."""
    unique = list(dict.fromkeys(first + second))  # encode each distinct sentence once
    vectors = encoder.encode(unique, batch_size=batch_size, normalize=True)
    index = {s: i for i, s in enumerate(unique)}
    a = vectors[[index[s] for s in first]]
    b = vectors[[index[s] for s in second]]
    cosine = (a * b).sum(1)
    return {"spearman": spearman(cosine, scores), "pearson": pearson(cosine, scores), "pairs": len(scores)}


def _read_jsonl(path: Path) -> list[dict]:
    records = []
    for n, line in enumerate(_read_lines(path), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not JSON ({e.msg})") from e
    return records


def read_beir(corpus: str | Path, queries: str | Path, qrels: str | Path):
    """(doc ids, doc texts, query ids, query texts, {query: {doc: relevance}}) for the queries that have qrels."""
    docs = _read_jsonl(Path(corpus))
    doc_ids = [str(d["_id"]) for d in docs]
    doc_texts = [(d.get("title", "") + " " + d.get("text", "")).strip() for d in docs]
    relevance: dict[str, dict[str, int]] = {}
    lines = _read_lines(Path(qrels))
    for n, line in enumerate(lines, start=1):
        parts = line.strip().split("\t")
        if n == 1 and not parts[-1].lstrip("-").isdigit():
            continue  # header
        if len(parts) < 3:
            raise DataError(f"{qrels}:{n}: expected query-id, corpus-id, score")
        relevance.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    known = set(doc_ids)
    unknown = {d for rel in relevance.values() for d in rel} - known
    if unknown:
        raise DataError(f"{qrels}: {len(unknown)} judged document(s) are not in {corpus} (e.g. {sorted(unknown)[0]})")
    queries_list = [q for q in _read_jsonl(Path(queries)) if str(q["_id"]) in relevance]
    if not queries_list:
        raise DataError(f"{queries}: no query has a judgement in {qrels}")
    return doc_ids, doc_texts, [str(q["_id"]) for q in queries_list], [q["text"] for q in queries_list], relevance


def retrieval_metrics(ranked: list[list[str]], query_ids: list[str], relevance: dict[str, dict[str, int]]) -> dict:
    """nDCG@10 (graded gains, log2 discount), recall@100 and MRR@10, averaged over queries (as BEIR computes)."""
    ndcg, recall, mrr = [], [], []
    for qid, docs in zip(query_ids, ranked):
        rel = relevance[qid]
        dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(docs[:10]))
        ideal = sorted((g for g in rel.values() if g > 0), reverse=True)[:10]
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
        ndcg.append(dcg / idcg if idcg > 0 else 0.0)
        relevant = {d for d, g in rel.items() if g > 0}
        recall.append(len(relevant & set(docs[:100])) / len(relevant) if relevant else 0.0)
        mrr.append(next((1.0 / (i + 1) for i, d in enumerate(docs[:10]) if d in relevant), 0.0))
    return {"ndcg@10": float(np.mean(ndcg)), "recall@100": float(np.mean(recall)), "mrr@10": float(np.mean(mrr)),
            "queries": len(query_ids)}


def exact_search(query_vectors: np.ndarray, doc_vectors: np.ndarray, k: int = 100, batch_size: int = 256):
    """Top-k documents per query by dot product, queries in batches. Returns (Q, k) indices."""
    docs = torch.from_numpy(doc_vectors)
    k = min(k, len(doc_vectors))
    out = []
    for start in range(0, len(query_vectors), batch_size):
        scores = torch.from_numpy(query_vectors[start : start + batch_size]) @ docs.T  # (q, D)
        out.append(scores.topk(k, dim=1).indices.numpy())
    return np.concatenate(out)


def evaluate_retrieval(encoder, corpus, queries, qrels, batch_size: int = 64, truncation: str = "chunk",
                       stride: int | None = None) -> dict:
    """nDCG@10, recall@100 and MRR@10 of exact search; documents longer than max_seq_length are embedded as the mean
    of their windows (`truncation="truncate"` cuts them, as sentence-transformers does)."""
    doc_ids, doc_texts, query_ids, query_texts, relevance = read_beir(corpus, queries, qrels)
    doc_vectors = encoder.encode(doc_texts, batch_size=batch_size, truncation=truncation, stride=stride)
    query_vectors = encoder.encode(query_texts, batch_size=batch_size, truncation=truncation, stride=stride)
    top = exact_search(query_vectors, doc_vectors, k=100)
    ranked = [[doc_ids[j] for j in row] for row in top]
    return retrieval_metrics(ranked, query_ids, relevance)
