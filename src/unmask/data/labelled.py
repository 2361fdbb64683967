"""Labelled examples for fine-tuning and evaluation: tokenized, aligned, with label ids.

- classification and pairs: one text (`[CLS] a [SEP]`) or a pair (`[CLS] a [SEP] b [SEP]`, token types 0 then 1),
  a label from a fixed set or a number (regression, e.g. STS-B scores); pairs longer than the limit lose tokens
  from the longer side first, as `transformers` truncates them;
- tagging: a word's label goes on its first piece; its other pieces and the special tokens get -100, so the loss
  and the metric see one decision per word (BERT's recipe);
- bi-encoder pairs: two texts, with a score (CoSENT) or without (in-batch negatives).

`LabelledFormat` says how a file is read: the `finetune` and `eval` flags of the same names.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from typing import Callable, Sequence

import numpy as np
import torch

from unmask.data.collate import pad_batch
from unmask.data.readers import column, is_sts_release, read_beir, read_conll, read_sts, read_table
from unmask.errors import DataError
from unmask.models.outputs import IGNORE_INDEX

TeacherScorer = Callable[[list[tuple[str, str]]], Sequence[float]]  # (query, document) pairs -> a score each


@dataclass
class LabelledFormat:
    """How to read a labelled file for `task` (classify, pair, tag, embed)."""

    task: str
    text_column: str = "sentence"
    text_pair_column: str | None = None  # pair / embed: the second text ("sentence2" when not given)
    label_column: str = "label"
    regression: bool = False  # predict a number (num_labels = 1, MSE)
    label_scale: float = 1.0  # regression targets are divided by this (STS-B: 5)
    max_seq_length: int = 128
    anchor_column: str = "anchor"  # tuple tables (embed, pair): the query / anchor text
    positive_column: str = "positive"
    negative_columns: str | None = None  # "neg_a,neg_b"; default every column whose name starts with "negative"
    in_batch_negatives: int = 4  # pair on tuple tables: other rows' positives ranked as each anchor's negatives


@dataclass
class ClassificationData:
    """Tokenized examples with their label ids (or float targets for regression)."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    labels: list  # int ids, or floats for regression
    truncated: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)

    def collate(self, indices, pad_token_id: int) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = pad_batch([self.input_ids[i] for i in indices], pad_token_id)
        token_type_ids, _ = pad_batch([self.token_type_ids[i] for i in indices], 0)
        dtype = torch.float32 if isinstance(self.labels[0], float) else torch.long
        labels = torch.tensor([self.labels[i] for i in indices], dtype=dtype)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                "labels": labels}


@dataclass
class RankingData:
    """Cross-encoder ranking examples from an (anchor, positive, negative...) table: each anchor with its
    candidates, positive first, as pieces without special tokens. A batch joins each anchor with its own candidates
    and with the positives of the next `in_batch_negatives` rows as further negatives (sentence-transformers'
    cross-encoder MultipleNegativesRankingLoss draws them at random; here the shuffled order draws them, so a
    resumed run sees the same batches). A borrowed positive that is the anchor's own positive, or that comes from a
    row with the same anchor, is left out of its softmax."""

    anchors: list[list[int]]
    candidates: list[list[list[int]]]  # per row: the positive, then the hard negatives
    cls_id: int
    sep_id: int
    max_length: int
    in_batch_negatives: int = 4
    truncated: int = 0

    def __len__(self) -> int:
        return len(self.anchors)

    def collate(self, indices, pad_token_id: int) -> dict[str, torch.Tensor]:
        rows = list(indices)
        borrowed = min(self.in_batch_negatives, len(rows) - 1)
        pairs, valid = [], []
        for j, i in enumerate(rows):
            others = [rows[(j + s) % len(rows)] for s in range(1, borrowed + 1)]
            documents = self.candidates[i] + [self.candidates[o][0] for o in others]
            valid.append([True] * len(self.candidates[i]) + [self.anchors[o] != self.anchors[i] and
                                                           self.candidates[o][0] != self.candidates[i][0]
                                                           for o in others])
            pairs += [join_pair(self.anchors[i], d, self.cls_id, self.sep_id, self.max_length) for d in documents]
        input_ids, attention_mask = pad_batch([ids for ids, _ in pairs], pad_token_id)
        token_type_ids, _ = pad_batch([types for _, types in pairs], 0)
        shape = (len(rows), len(valid[0]), -1)  # (B, n, T): a row per anchor, as the loop splits batches by rows
        return {"input_ids": input_ids.view(shape), "attention_mask": attention_mask.view(shape),
                "token_type_ids": token_type_ids.view(shape), "candidate_mask": torch.tensor(valid),
                "labels": torch.zeros(len(rows), dtype=torch.long)}


def load_ranking(spec: "LabelledFormat", tokenizer, path: str, rows: list[dict]) -> RankingData:
    """A cross-encoder's ranking examples from the rows of an (anchor, positive, negative...) table."""
    anchors, positives, negatives = _tuples(spec, rows, path)
    if not negatives[0]:
        raise DataError(f"{path}: a cross-encoder learns from negatives too: add negative columns (an anchor / "
                        "positive table trains finetune embed)")
    width = 1 + len(negatives[0])
    pieces = [e.ids for e in tokenizer.encode_batch([*anchors, *(d for p, ns in zip(positives, negatives)
                                                                  for d in [p, *ns])], add_special_tokens=False)]
    anchor_ids, documents = pieces[: len(anchors)], pieces[len(anchors):]
    candidates = [documents[r * width : (r + 1) * width] for r in range(len(anchors))]
    budget = spec.max_seq_length - 3
    truncated = sum(len(a) + len(d) > budget for a, row in zip(anchor_ids, candidates) for d in row)
    return RankingData(anchor_ids, candidates, tokenizer.cls_token_id, tokenizer.sep_token_id, spec.max_seq_length,
                       spec.in_batch_negatives, truncated)


def encode_texts(tokenizer, texts: list[str], pairs: list[str] | None, max_length: int):
    """Token ids and types; pairs longer than max_length lose tokens from the longer side first (HF's rule)."""
    inputs = list(zip(texts, pairs)) if pairs is not None else texts
    encodings = tokenizer.encode_batch(inputs)
    ids, types, truncated = [], [], 0
    for enc in encodings:
        seq, typ = enc.ids, enc.type_ids
        if len(seq) > max_length:
            truncated += 1
            seq, typ = _truncate(seq, typ, max_length)
        ids.append(seq)
        types.append(typ)
    return ids, types, truncated


def _truncate(ids: list[int], types: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """Drop tokens before each segment's closing [SEP] so that the whole fits `max_length` (HF's longest_first)."""
    if not any(types):  # one segment: keep [CLS] ... and the final [SEP]
        return ids[: max_length - 1] + ids[-1:], types[:max_length]
    split = types.index(1)
    return join_pair(ids[1 : split - 1], ids[split:-1], ids[0], ids[-1], max_length)


def join_pair(a: list[int], b: list[int], cls_id: int, sep_id: int, max_length: int) -> tuple[list[int], list[int]]:
    """(ids, token types) of `[CLS] a [SEP] b [SEP]` from two texts' pieces, cut longest-first to `max_length`."""
    keep_a, keep_b = _longest_first(len(a), len(b), max_length - 3)
    return [cls_id, *a[:keep_a], sep_id, *b[:keep_b], sep_id], [0] * (keep_a + 2) + [1] * (keep_b + 1)


def _longest_first(n_a: int, n_b: int, budget: int) -> tuple[int, int]:
    """How many tokens of each segment to keep: the shorter one whole if the longer can absorb the cut, else the
    budget split in halves with the odd token to the originally longer segment (the `tokenizers` rule, so that our
    pairs are token-for-token those of `AutoTokenizer(a, b, truncation=True)`)."""
    if n_a + n_b <= budget:
        return n_a, n_b
    short, long = sorted((n_a, n_b))
    long = short if short > budget else max(short, budget - short)
    if short + long > budget:
        short, long = budget // 2, budget - budget // 2
    return (long, short) if n_a > n_b else (short, long)


def label_ids(values: list, label2id: dict[str, int], path) -> list[int]:
    out = []
    for n, value in enumerate(values, start=1):
        key = str(value).strip()
        if key not in label2id:
            raise DataError(f"{path}: row {n} has label {key!r}, which the model does not know "
                            f"(labels: {', '.join(label2id)})")
        out.append(label2id[key])
    return out


def build_label_map(values: list) -> dict[str, int]:
    """Labels in a stable order: numerically when they are all numbers ("0", "1"), else alphabetically."""
    names = sorted({str(v).strip() for v in values})
    try:
        names.sort(key=float)
    except ValueError:
        pass
    return {name: i for i, name in enumerate(names)}


def load_examples(rows: list[dict], path, tokenizer, text_column: str, label_column: str,
                  text_pair_column: str | None, max_length: int, label2id: dict[str, int] | None) -> ClassificationData:
    """A table's rows (read from `path`) as examples; `label2id=None` means regression (float targets)."""
    texts = [str(t) for t in column(rows, text_column, path)]
    pairs = [str(t) for t in column(rows, text_pair_column, path)] if text_pair_column else None
    raw = column(rows, label_column, path)
    if label2id is None:
        try:
            labels = [float(v) for v in raw]
        except ValueError as e:
            raise DataError(f"{path}: column {label_column!r} must hold numbers for regression ({e})") from e
    else:
        labels = label_ids(raw, label2id, path)
    ids, types, truncated = encode_texts(tokenizer, texts, pairs, max_length)
    return ClassificationData(ids, types, labels, truncated)


@dataclass
class TaggingData:
    input_ids: list[list[int]]
    labels: list[list[int]]  # label id on each word's first piece, -100 elsewhere
    first_piece: list[list[int]]  # per sentence: the piece index of each word (-1 if cut off by max_length)
    tags: list[list[str]]  # gold tags per word
    truncated: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)

    def collate(self, indices, pad_token_id: int) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = pad_batch([self.input_ids[i] for i in indices], pad_token_id)
        labels, _ = pad_batch([self.labels[i] for i in indices], IGNORE_INDEX)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def align(tokenizer, sentences: list[list[str]], tags: list[list[str]], label2id: dict[str, int],
          max_length: int, path="data") -> TaggingData:
    """Tokenize pre-split words; put each word's label on its first piece."""
    encodings = tokenizer.encode_batch(sentences, is_pretokenized=True)
    all_ids, all_labels, all_first, truncated = [], [], [], 0
    for n, (enc, sentence_tags) in enumerate(zip(encodings, tags), start=1):
        ids = enc.ids
        if len(ids) > max_length:  # keep [CLS] ... [SEP]; words past the cut get no prediction (counted)
            truncated += 1
            ids = ids[: max_length - 1] + ids[-1:]
        labels = [IGNORE_INDEX] * len(ids)
        first = [-1] * len(sentence_tags)
        previous = None
        for position, word in enumerate(enc.word_ids[: len(ids) - 1]):
            if word is not None and word != previous:
                tag = sentence_tags[word]
                if tag not in label2id:
                    raise DataError(f"{path}: sentence {n} has tag {tag!r}, which the model does not know "
                                    f"(tags: {', '.join(label2id)})")
                labels[position] = label2id[tag]
                first[word] = position
            previous = word
        all_ids.append(ids)
        all_labels.append(labels)
        all_first.append(first)
    return TaggingData(all_ids, all_labels, all_first, tags, truncated)


def tag_label_map(tags: list[list[str]]) -> dict[str, int]:
    """O first, then the entity tags grouped by type (B- before I-)."""
    names = sorted({t for sentence in tags for t in sentence} - {"O"}, key=lambda t: (t[2:], t[:2]))
    return {name: i for i, name in enumerate(["O", *names])}


@dataclass
class PairData:
    """Bi-encoder training examples: (a, b) pairs with `scores` for CoSENT, or else an anchor `a`, its positive `b`
    and the same number of hard `negatives` for each (none: in-batch negatives only), with a teacher's scores of
    the positive and each negative when distilling."""

    a: list[list[int]]
    b: list[list[int]]
    scores: list[float] | None
    negatives: list[list[list[int]]] | None = None  # per example, its k negatives
    teacher_scores: list[list[float]] | None = None  # per example, 1 + k: the positive's, then each negative's

    def __len__(self) -> int:
        return len(self.a)

    def collate(self, indices, pad_token_id: int) -> dict[str, torch.Tensor]:
        """Scored pairs: `input_ids_b` (B, T) and float `labels`. Otherwise `input_ids_b` (B, 1 + k, T), each
        anchor's positive then its negatives (so a slice of rows keeps every example whole), `labels` its row."""
        input_ids, attention_mask = pad_batch([self.a[i] for i in indices], pad_token_id)
        if self.scores is not None:
            input_ids_b, attention_mask_b = pad_batch([self.b[i] for i in indices], pad_token_id)
            labels = torch.tensor([self.scores[i] for i in indices], dtype=torch.float32)
        else:
            candidates = [[self.b[i], *(self.negatives[i] if self.negatives else [])] for i in indices]
            input_ids_b, attention_mask_b = pad_batch([c for row in candidates for c in row], pad_token_id)
            input_ids_b = input_ids_b.view(len(indices), len(candidates[0]), -1)
            attention_mask_b = attention_mask_b.view(len(indices), len(candidates[0]), -1)
            labels = torch.arange(len(indices))
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "input_ids_b": input_ids_b,
                 "attention_mask_b": attention_mask_b, "labels": labels}
        if self.teacher_scores is not None:
            batch["teacher_scores"] = torch.tensor([self.teacher_scores[i] for i in indices], dtype=torch.float32)
        return batch


def load_task_data(spec: LabelledFormat, tokenizer, path: str, label2id: dict | None):
    """Examples of one file for the task; `label2id` None on the training file builds it (or means regression)."""
    if spec.task == "tag":
        sentences, tags = read_conll(path)
        label2id = label2id or tag_label_map(tags)
        return align(tokenizer, sentences, tags, label2id, spec.max_seq_length, path), label2id
    text_column, pair_column = spec.text_column, spec.text_pair_column
    if spec.task == "pair":
        pair_column = pair_column or "sentence2"
        if is_sts_release(path):
            first, second, scores = read_sts(path)
            rows = [{"sentence1": a, "sentence2": b, "label": s} for a, b, s in zip(first, second, scores)]
            data = _from_rows(spec, tokenizer, rows, path, "sentence1", "sentence2", label2id)
            return data, label2id
        if text_column == "sentence":
            text_column = "sentence1"
    rows = read_table(path)  # once: the tuple check, the label map and the examples read these rows
    if spec.task == "pair" and spec.anchor_column in rows[0]:  # (anchor, positive, negative...) tuples: a reranker
        return load_ranking(spec, tokenizer, path, rows), None
    if not spec.regression and label2id is None:
        label2id = build_label_map(column(rows, spec.label_column, path))
        if len(label2id) < 2:
            raise DataError(f"{path}: column {spec.label_column!r} has a single label; nothing to learn")
    data = load_examples(rows, path, tokenizer, text_column, spec.label_column, pair_column, spec.max_seq_length,
                         None if spec.regression else label2id)
    if spec.regression and spec.label_scale != 1.0:
        data.labels = [v / spec.label_scale for v in data.labels]
    return data, label2id


def _from_rows(spec, tokenizer, rows, path, first, second, label2id):
    ids, types, truncated = encode_texts(tokenizer, [r[first] for r in rows], [r[second] for r in rows],
                                         spec.max_seq_length)
    if label2id is None:  # regression on the score
        labels = [float(r["label"]) / spec.label_scale for r in rows]
    else:
        labels = label_ids([r["label"] for r in rows], label2id, path)
    return ClassificationData(ids, types, labels, truncated)


def load_pairs(spec: LabelledFormat, tokenizer, path: str, teacher: TeacherScorer | None = None):
    """Bi-encoder examples: the STS Benchmark release; a table with `anchor`, `positive` and any number of
    `negative...` columns (sentence-transformers' names: triplets, n-tuples); or two text columns (and optional
    scores). A tuple table's label column, or else the `teacher`, gives the scores that distillation fits."""
    negatives = teacher_scores = None
    if is_sts_release(path):
        first, second, scores = read_sts(path)
        scores = scores.tolist()
    else:
        rows = read_table(path)
        if spec.anchor_column in rows[0]:
            first, second, negatives = _tuples(spec, rows, path)
            scores = None
            teacher_scores = _teacher_scores(rows, path, spec.label_column, first, second, negatives, teacher)
        else:
            text_column = "sentence1" if spec.text_column == "sentence" else spec.text_column
            first = [str(v) for v in column(rows, text_column, path)]
            second = [str(v) for v in column(rows, spec.text_pair_column or "sentence2", path)]
            scores = ([float(v) for v in column(rows, spec.label_column, path)] if spec.label_column in rows[0]
                      else None)

    def ids(texts):
        return _piece_ids(tokenizer, texts, spec.max_seq_length)

    if negatives is not None:
        columns = [ids([row[c] for row in negatives]) for c in range(len(negatives[0]))]
        negatives = [list(example) for example in zip(*columns)] if columns else None
    return PairData(ids(first), ids(second), scores, negatives, teacher_scores)


def _teacher_scores(rows: list[dict], path, label_column: str, anchors: list[str], positives: list[str],
                    negatives: list[list[str]], teacher: TeacherScorer | None) -> list[list[float]] | None:
    """Per row, the teacher's 1 + k scores (positive, then each negative): the `teacher`'s, or the label column's
    list of 1 + k scores, or of k margins t_pos - t_neg_i (sentence-transformers' MarginMSE labels; read as scores
    [0, -m_1, ...], which have the same margins and the same softmax)."""
    if teacher is not None or label_column not in rows[0]:
        if teacher is None:
            return None
        if not negatives[0]:
            raise DataError(f"{path}: distilling a teacher's scores needs negative columns (unmask mine writes them)")
        pairs = [(a, text) for a, p, ns in zip(anchors, positives, negatives) for text in (p, *ns)]
        return np.asarray(teacher(pairs), dtype=np.float64).reshape(len(anchors), -1).tolist()
    k, out = len(negatives[0]), []
    if not k:
        raise DataError(f"{path}: an anchor / positive table's {label_column!r} column holds a teacher's scores of "
                        "the positive and the negatives, and this table has no negative column (scored pairs for "
                        "CoSENT are sentence1 / sentence2 / label)")
    for n, row in enumerate(rows, start=1):
        value = row.get(label_column)
        try:
            scores = [float(v) for v in (json.loads(value) if isinstance(value, str) else value)]
        except (TypeError, ValueError):
            scores = []
        if len(scores) not in (k, k + 1) or not all(map(math.isfinite, scores)):
            raise DataError(f"{path}: row {n}: column {label_column!r} must hold the teacher's scores of the positive "
                            f"and the {k} negatives ({k + 1} numbers), or {k} margins; got {value!r}")
        out.append(scores if len(scores) == k + 1 else [0.0, *(-m for m in scores)])
    return out


def load_beir_pairs(spec: LabelledFormat, tokenizer, corpus: str, queries: str, qrels: str) -> PairData:
    """(query, document) pairs for every judgement above 0 of a BEIR training set (title and text joined, as BEIR
    does): multiple-negatives ranking, the other documents of a batch its negatives."""
    doc_ids, doc_texts, query_ids, query_texts, relevance = read_beir(corpus, queries, qrels)
    text_of = dict(zip(doc_ids, doc_texts))  # read_beir refuses a relevant document without text
    pairs = [(query, text_of[doc]) for qid, query in zip(query_ids, query_texts)
             for doc, score in relevance[qid].items() if score > 0]
    if not pairs:
        raise DataError(f"{qrels}: no judgement above 0, so no training pair")
    return PairData(_piece_ids(tokenizer, [q for q, _ in pairs], spec.max_seq_length),
                    _piece_ids(tokenizer, [d for _, d in pairs], spec.max_seq_length), None)


def _piece_ids(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    """Each text's ids, cut to `max_length` with its final [SEP] kept."""
    return [e.ids if len(e.ids) <= max_length else e.ids[: max_length - 1] + e.ids[-1:]
            for e in tokenizer.encode_batch(texts)]


def _tuples(spec: LabelledFormat, rows: list[dict], path) -> tuple[list[str], list[str], list[list[str]]]:
    """(anchors, positives, each row's negatives) of an (anchor, positive, negative...) table; a missing or empty
    cell is an error naming its row."""
    negative_columns = (spec.negative_columns.split(",") if spec.negative_columns else
                        [name for name in rows[0] if name.startswith("negative")])
    columns = [spec.anchor_column, spec.positive_column, *negative_columns]
    for n, row in enumerate(rows, start=1):
        for name in columns:
            if not isinstance(row.get(name), str) or not row[name].strip():
                raise DataError(f"{path}: row {n}: column {name!r} is missing or empty (every row of an anchor / "
                                f"positive / negative table needs all of {columns})")
    return ([r[spec.anchor_column] for r in rows], [r[spec.positive_column] for r in rows],
            [[r[name] for name in negative_columns] for r in rows])


def labels_seen(data) -> set[int]:
    """The label ids that occur in a ClassificationData or TaggingData."""
    if isinstance(data, TaggingData):
        return {label for row in data.labels for label in row if label != IGNORE_INDEX}
    return set(data.labels)


def first_examples(data, n: int | None):
    """The first `n` examples of a ClassificationData, TaggingData or PairData (every per-example list cut alike);
    all of them when `n` is None (transformers' --max_train_samples / --max_eval_samples)."""
    if n is None:
        return data
    return replace(data, **{f.name: getattr(data, f.name)[:n] for f in fields(data)
                            if isinstance(getattr(data, f.name), list)})
