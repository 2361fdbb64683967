"""Readers for labelled and evaluation files; each names the file and line of what it cannot read.

- tables: TSV (header), CSV (header) or JSONL, as rows of column -> value (`read_table`, `column`);
- CoNLL column files: token first, tag last, `-DOCSTART-` and blank lines between sentences (`read_conll`);
- STS: the STS Benchmark release (tab-separated genre, file, year, id, score, sentence1, sentence2; no header), or
  any TSV with a header / JSONL with named columns (`read_sts`);
- BEIR retrieval sets: `corpus.jsonl` (`_id`, `title`, `text`), `queries.jsonl` (`_id`, `text`), and a qrels TSV
  (`query-id`, `corpus-id`, `score`, with a header) (`read_beir`);
- sentence files: one sentence per line (`read_sentences`).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from unmask.data.sources import json_objects, read_text
from unmask.errors import DataError


def read_table(path: str | Path) -> list[dict[str, str]]:
    """Rows of a CSV / TSV (with a header) or JSONL file, as dicts of column -> value. The delimiter is the
    extension's (.csv comma, .tsv tab); other names are read as TSV, or CSV when the header has commas only."""
    path = Path(path)
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    if name.endswith((".jsonl", ".json")):
        rows = [record for _, record in _read_jsonl(path)]
    else:
        lines = _read_lines(path)
        delimiter = _delimiter(name, lines[0])
        rows = _csv_rows(path, lines, delimiter)  # the csv module's quoting: a quoted field may hold the delimiter
        header = list(rows[0]) if rows else lines[0].split(delimiter)
        other = "\t" if delimiter == "," else ","
        if len(header) == 1 and other in header[0]:
            kind = "comma" if delimiter == "," else "tab"
            raise DataError(f"{path}: read as {kind}-separated (by its name), but its header is one column "
                            f"{header[0][:80]!r}; name it .{'tsv' if delimiter == ',' else 'csv'} or convert it")
    if not rows:
        raise DataError(f"{path}: no examples")
    return rows


def _csv_rows(path: Path, lines: list[str], delimiter: str) -> list[dict[str, str]]:
    """The rows under the header; a row with more fields than the header is an error naming its line."""
    reader = csv.DictReader(lines, delimiter=delimiter)
    rows = []
    for row in reader:
        if None in row:  # DictReader files the surplus fields under None
            raise DataError(f"{path}:{reader.line_num}: {len(reader.fieldnames) + len(row[None])} fields, the header "
                            f"has {len(reader.fieldnames)}; quote a field that holds the delimiter "
                            f"({delimiter!r})")
        rows.append(row)
    return rows


def _delimiter(name: str, header: str) -> str:
    if name.endswith(".csv"):
        return ","
    if name.endswith(".tsv"):
        return "\t"
    return "," if "," in header and "\t" not in header else "\t"


def column(rows: list[dict], name: str, path) -> list:
    if name not in rows[0]:
        raise DataError(f"{path}: no column {name!r} (columns: {', '.join(map(str, rows[0]))})")
    values = [row.get(name) for row in rows]
    missing = next((i for i, v in enumerate(values) if v is None or (isinstance(v, str) and not v.strip())), None)
    if missing is not None:
        raise DataError(f"{path}: row {missing + 1} has no value in column {name!r}")
    return values


def read_conll(path: str | Path) -> tuple[list[list[str]], list[list[str]]]:
    """Sentences of (words, tags) from a CoNLL column file: token first, tag last; -DOCSTART- and blank lines split."""
    path = Path(path)
    sentences, tags = [], []
    words, labels = [], []
    for n, line in enumerate(read_text(path).split("\n"), start=1):
        parts = line.split()
        if not parts or parts[0] == "-DOCSTART-":
            if words:
                sentences.append(words)
                tags.append(labels)
                words, labels = [], []
            continue
        if len(parts) < 2:
            raise DataError(f"{path}:{n}: expected a token and a tag, got {line!r}")
        if "\t" in line and any(" " in field.strip() for field in line.split("\t")):
            raise DataError(f"{path}:{n}: a field of several words ({line[:60]!r}): a CoNLL file has one token per "
                            "line, its tag in the last column (a table of sentences is for finetune classify)")
        words.append(parts[0])
        labels.append(parts[-1])
    if words:
        sentences.append(words)
        tags.append(labels)
    if not sentences:
        raise DataError(f"{path}: no sentences")
    return sentences, tags


def _read_lines(path: Path) -> list[str]:
    return read_text(path).split("\n")


def read_sts(path: str | Path, sentence1_column: str | None = None, sentence2_column: str | None = None,
             score_column: str | None = None) -> tuple[list[str], list[str], np.ndarray]:
    """Pairs and gold scores. Without column names the file is read as the STS Benchmark release."""
    path = Path(path)
    first, second, scores = [], [], []
    if sentence1_column is None:  # STS Benchmark: genre, file, year, id, score, s1, s2 [, sources]
        lines = [line for line in _read_lines(path) if line.strip()]
        if not lines:
            raise DataError(f"{path}: empty file")
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
    rows = read_table(path)  # CSV, TSV or JSONL, as finetune reads them
    first, second = (column(rows, name, path) for name in (sentence1_column, sentence2_column or "sentence2"))
    for n, value in enumerate(column(rows, score_column or "score", path), start=1):
        try:
            scores.append(float(value))
        except (TypeError, ValueError) as e:
            raise DataError(f"{path}: row {n}: score {value!r} is not a number") from e
    return [str(t) for t in first], [str(t) for t in second], np.asarray(scores)


def _read_jsonl(path: Path, required: tuple[str, ...] = ()) -> list[tuple[int, dict]]:
    """(line number, record) of each non-blank line; a line that is not a JSON object, or lacks a `required` field
    (or has it empty), names itself."""
    records = list(json_objects(path, _read_lines(path)))
    for n, record in records:
        for name in required:
            if record.get(name) in (None, ""):
                raise DataError(f"{path}:{n}: no {name!r} (a BEIR {path.name} line needs {', '.join(required)})")
    return records


def _read_qrels(qrels: Path) -> tuple[dict[str, dict[str, int]], dict[tuple[str, str], int]]:
    """({query: {doc: relevance}}, the line of each judgement)."""
    relevance: dict[str, dict[str, int]] = {}
    where: dict[tuple[str, str], int] = {}
    for n, line in enumerate(_read_lines(qrels), start=1):
        parts = line.strip().split("\t")
        if not line.strip() or (n == 1 and not parts[-1].lstrip("-").isdigit()):
            continue  # blank, or the header
        try:
            score = float(parts[2]) if len(parts) == 3 else math.nan
        except ValueError:
            score = math.nan
        if not score.is_integer():
            raise DataError(f"{qrels}:{n}: expected query-id, corpus-id and an integer score, tab-separated; got "
                            f"{line.strip()[:80]!r}")
        relevance.setdefault(parts[0], {})[parts[1]] = int(score)
        where[parts[0], parts[1]] = n
    return relevance, where


def read_beir(corpus: str | Path, queries: str | Path, qrels: str | Path):
    """(doc ids, doc texts, query ids, query texts, {query: {doc: relevance}}) for the queries that have qrels; title
    and text joined as BEIR does. A judgement naming an unknown document or query, or a relevant document with no
    text, is an error naming its line."""
    corpus, queries, qrels = Path(corpus), Path(queries), Path(qrels)
    docs = [record for _, record in _read_jsonl(corpus, ("_id",))]
    doc_ids = [str(d["_id"]) for d in docs]
    doc_texts = [(str(d.get("title") or "") + " " + str(d.get("text") or "")).strip() for d in docs]
    relevance, where = _read_qrels(qrels)
    text_of = dict(zip(doc_ids, doc_texts))
    query_text = {str(q["_id"]): str(q["text"]) for _, q in _read_jsonl(queries, ("_id", "text"))}
    for (query, doc), n in where.items():
        if doc not in text_of:
            raise DataError(f"{qrels}:{n}: document {doc!r} is not in {corpus}")
        if query not in query_text:
            raise DataError(f"{qrels}:{n}: query {query!r} is not in {queries}")
        if relevance[query][doc] > 0 and not text_of[doc]:
            raise DataError(f"{qrels}:{n}: document {doc!r} is judged relevant but has no title or text in {corpus}")
    query_ids = [q for q in query_text if q in relevance]
    if not query_ids:
        raise DataError(f"{queries}: no query has a judgement in {qrels}")
    return doc_ids, doc_texts, query_ids, [query_text[q] for q in query_ids], relevance


def is_sts_release(path: str) -> bool:
    """The STS Benchmark release: no header, tab-separated, the score in the fifth field."""
    with open(path, encoding="utf-8", errors="replace") as f:
        fields = f.readline().rstrip("\n").split("\t")
    try:
        float(fields[4])
        return len(fields) >= 7
    except (IndexError, ValueError):
        return False


def read_sentences(path: str) -> list[str]:
    lines = read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise DataError(f"{path}: no sentences (one per line expected)")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise DataError(f"{path}:{number}: empty line; every line is a sentence and gets a vector")
    return lines
