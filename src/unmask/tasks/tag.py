"""Token tagging (NER and friends): CoNLL files, word-to-piece label alignment, entity F1, entity prediction.

A word's label goes on its first piece; its other pieces and the special tokens get -100, so the loss and the
metric see one decision per word (BERT's recipe). Predictions are read back at first pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from unmask.data.collate import pad_batch
from unmask.data.masking import IGNORE_INDEX
from unmask.data.sources import DataError, read_text
from unmask.data.windows import make_windows, most_central
from unmask.tasks.seqeval import entities, entity_scores


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
        words.append(parts[0])
        labels.append(parts[-1])
    if words:
        sentences.append(words)
        tags.append(labels)
    if not sentences:
        raise DataError(f"{path}: no sentences")
    return sentences, tags


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


@torch.inference_mode()
def predict_tags(model, data: TaggingData, pad_token_id: int, batch_size: int = 64,
                 device: torch.device = torch.device("cpu")) -> list[list[str]]:
    """Tags per word (a word cut off by max_length is tagged O)."""
    id2label = model.config.id2label
    was_training = model.training
    model.eval()
    predicted: list[list[str]] = [[] for _ in range(len(data))]
    order = np.argsort([len(s) for s in data.input_ids], kind="stable")
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        batch = data.collate(rows, pad_token_id)
        logits = model(batch["input_ids"].to(device), batch["attention_mask"].to(device)).logits
        best = logits.argmax(-1).cpu().tolist()  # (B, T)
        for row, sentence in zip(rows, best):
            predicted[row] = [id2label[sentence[p]] if p >= 0 else "O" for p in data.first_piece[row]]
    model.train(was_training)
    return predicted


def evaluate_tagging(model, data: TaggingData, pad_token_id: int, batch_size: int = 64,
                     device: torch.device = torch.device("cpu")) -> dict:
    predicted = predict_tags(model, data, pad_token_id, batch_size, device)
    scores = entity_scores(data.tags, predicted)
    words = sum(len(t) for t in data.tags)
    correct = sum(g == p for gs, ps in zip(data.tags, predicted) for g, p in zip(gs, ps))
    return {"precision": scores["precision"], "recall": scores["recall"], "f1": scores["f1"],
            "word_accuracy": correct / words, "sentences": len(data), "per_type": scores["per_type"]}


@torch.inference_mode()
def predict_entities(model, tokenizer, texts: list[str], truncation: str = "chunk", stride: int | None = None,
                     batch_size: int = 32) -> list[list[dict]]:
    """Entities in raw text with character offsets, like the HF token-classification pipeline with
    aggregation_strategy="first": `entity_group`, `score`, `word`, `start`, `end`. A text longer than the context
    is read in overlapping windows, each token tagged from the window where it is most central."""
    model.eval()
    id2label = model.config.id2label
    if any(not isinstance(t, str) or not t.strip() for t in texts):
        raise ValueError("empty text")
    encodings = tokenizer.encode_batch(list(texts))
    windows = make_windows([(e.ids, e.type_ids) for e in encodings], model.config.max_position_embeddings,
                           truncation, stride)
    per_window = []
    for start in range(0, len(windows), batch_size):
        input_ids, attention_mask = pad_batch(windows.input_ids[start : start + batch_size], tokenizer.pad_token_id)
        probs = model(input_ids, attention_mask).logits.float().softmax(-1).numpy()  # (B, T, labels)
        per_window += [p[: len(ids)] for p, ids in zip(probs, windows.input_ids[start : start + batch_size])]
    content_probs = most_central(windows, per_window, [len(e.ids) - 2 for e in encodings])
    results = []
    for text, enc, probs in zip(texts, encodings, content_probs):
        words: list[tuple[int, int, int]] = []  # (first piece, char start, char end) per word, over the content
        for position, word in enumerate(enc.word_ids[1:-1]):
            if word is None:
                continue
            if words and enc.word_ids[1 + words[-1][0]] == word:
                words[-1] = (words[-1][0], words[-1][1], enc.offsets[1 + position][1])
            else:
                words.append((position, *enc.offsets[1 + position]))
        if truncation == "truncate":  # words past the first window were not read
            words = [w for w in words if w[0] < len(probs) and probs[w[0]].any()]
        tags = [id2label[int(probs[p].argmax())] for p, _, _ in words]
        found = []
        for kind, first, last in entities(tags):
            start, end = words[first][1], words[last][2]
            score = float(np.mean([float(probs[words[i][0]].max()) for i in range(first, last + 1)]))
            found.append({"entity_group": kind, "score": score, "word": text[start:end], "start": start, "end": end})
        results.append(found)
    return results
