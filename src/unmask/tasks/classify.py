"""Sequence classification and sentence-pair scoring: data, batching, metrics, prediction.

One text (`[CLS] a [SEP]`) or a pair (`[CLS] a [SEP] b [SEP]`, token types 0 then 1) per example; a label from a
fixed set (classification) or a number (regression, `num_labels == 1`, e.g. STS-B scores).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from unmask.data.collate import pad_batch
from unmask.data.sources import DataError, read_text
from unmask.tasks.embed_eval import pearson, spearman


def read_table(path: str | Path) -> list[dict[str, str]]:
    """Rows of a TSV / CSV (with a header) or JSONL file, as dicts of column -> value."""
    path = Path(path)
    text = read_text(path)
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    if name.endswith((".jsonl", ".json")):
        rows = []
        for n, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{n}: not JSON ({e.msg})") from e
    else:
        delimiter = "," if name.endswith(".csv") else "\t"
        # QUOTE_NONE for TSV: SST-2 sentences contain bare quotes
        quoting = csv.QUOTE_MINIMAL if delimiter == "," else csv.QUOTE_NONE
        rows = list(csv.DictReader(text.splitlines(), delimiter=delimiter, quoting=quoting))
    if not rows:
        raise DataError(f"{path}: no examples")
    return rows


def column(rows: list[dict], name: str, path) -> list:
    if name not in rows[0]:
        raise DataError(f"{path}: no column {name!r} (columns: {', '.join(map(str, rows[0]))})")
    values = [row.get(name) for row in rows]
    missing = next((i for i, v in enumerate(values) if v is None or (isinstance(v, str) and not v.strip())), None)
    if missing is not None:
        raise DataError(f"{path}: row {missing + 1} has no value in column {name!r}")
    return values


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
    a, b = ids[1 : split - 1], ids[split:-1]
    keep_a, keep_b = _longest_first(len(a), len(b), max_length - 3)
    new = [ids[0], *a[:keep_a], ids[split - 1], *b[:keep_b], ids[-1]]
    return new, [0] * (keep_a + 2) + [1] * (keep_b + 1)


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


def load_examples(path, tokenizer, text_column: str, label_column: str, text_pair_column: str | None,
                  max_length: int, label2id: dict[str, int] | None) -> ClassificationData:
    """Read a file; `label2id=None` means regression (float targets)."""
    rows = read_table(path)
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


def macro_f1(gold: np.ndarray, predicted: np.ndarray, n_labels: int) -> float:
    f1s = []
    for label in range(n_labels):
        tp = int(((predicted == label) & (gold == label)).sum())
        fp = int(((predicted == label) & (gold != label)).sum())
        fn = int(((predicted != label) & (gold == label)).sum())
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return float(np.mean(f1s))


@torch.inference_mode()
def predict_logits(model, data: ClassificationData, pad_token_id: int, batch_size: int = 64,
                   device: torch.device = torch.device("cpu")) -> np.ndarray:
    """Logits in input order; batches are formed by length so little is padded."""
    was_training = model.training
    model.eval()
    order = np.argsort([len(s) for s in data.input_ids], kind="stable")
    out = None
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        batch = data.collate(rows, pad_token_id)
        batch.pop("labels")
        logits = model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu().numpy()
        if out is None:
            out = np.empty((len(order), logits.shape[-1]), dtype=np.float32)
        out[rows] = logits
    model.train(was_training)
    return out


def evaluate_classification(model, data: ClassificationData, pad_token_id: int, batch_size: int = 64,
                            device: torch.device = torch.device("cpu")) -> dict:
    logits = predict_logits(model, data, pad_token_id, batch_size, device)
    gold = np.asarray(data.labels)
    if model.config.num_labels == 1:  # regression
        scores = logits[:, 0]
        return {"spearman": spearman(scores, gold), "pearson": pearson(scores, gold),
                "mse": float(((scores - gold) ** 2).mean()), "examples": len(gold)}
    predicted = logits.argmax(-1)
    return {"accuracy": float((predicted == gold).mean()),
            "macro_f1": macro_f1(gold, predicted, model.config.num_labels), "examples": len(gold)}
