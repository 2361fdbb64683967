"""Token tagging (NER and friends): tags per word for labelled data, and entities with character offsets in raw
text, like the HF token-classification pipeline with aggregation_strategy="first".

Predictions are read at each word's first piece, where training put its label (data/labelled.py).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from tokenizers import Encoding

from unmask.data.labelled import TaggingData
from unmask.data.windows import make_windows, most_central
from unmask.metrics import entities
from unmask.pipelines.batching import check_texts, run_batches


def predict_tags(model, data: TaggingData, pad_token_id: int, batch_size: int = 64,
                 show_progress: bool = False) -> list[list[str]]:
    """Tags per word of aligned sentences (a word cut off by max_length is tagged O)."""
    id2label = model.config.id2label

    def forward(input_ids, attention_mask, token_type_ids):
        return model(input_ids, attention_mask).logits.argmax(-1).cpu().tolist()  # (B, T)

    best = run_batches(model, data.input_ids, forward, pad_token_id, batch_size, show_progress=show_progress)
    return [[id2label[sentence[p]] if p >= 0 else "O" for p in first]
            for sentence, first in zip(best, data.first_piece)]


def predict_entities(model, tokenizer, texts: Sequence[str], truncation: str = "chunk", stride: int | None = None,
                     batch_size: int = 32) -> list[list[dict]]:
    """Entities per text: `entity_group`, `score`, `word`, `start`, `end` (character offsets). A text longer than
    the context is read in overlapping windows, each token tagged from the window where it is most central."""
    texts = check_texts(texts)
    return entities_of(model, texts, tokenizer.encode_batch(texts), tokenizer.pad_token_id, truncation, stride,
                       batch_size)


def entities_of(model, texts: Sequence[str], encodings: Sequence[Encoding], pad_token_id: int,
                truncation: str = "chunk", stride: int | None = None, batch_size: int = 32) -> list[list[dict]]:
    """`predict_entities` for texts tokenized already (the server's encodings)."""
    windows = make_windows([(e.ids, e.type_ids) for e in encodings], model.config.max_position_embeddings,
                           truncation, stride)

    def forward(input_ids, attention_mask, token_type_ids):
        probs = model(input_ids, attention_mask).logits.float().softmax(-1).cpu().numpy()  # (B, T, labels)
        return [p[:n] for p, n in zip(probs, attention_mask.sum(1).tolist())]

    per_window = run_batches(model, windows.input_ids, forward, pad_token_id, batch_size)
    content_probs = most_central(windows, per_window, [len(e.ids) - 2 for e in encodings])
    return [_entities(model.config.id2label, text, encoding, probs, truncation)
            for text, encoding, probs in zip(texts, encodings, content_probs)]


def _words(encoding: Encoding) -> list[tuple[int, int, int]]:
    """(first piece, char start, char end) per word, over the content (no [CLS]/[SEP])."""
    words: list[tuple[int, int, int]] = []
    for position, word in enumerate(encoding.word_ids[1:-1]):
        if word is None:
            continue
        if words and encoding.word_ids[1 + words[-1][0]] == word:
            words[-1] = (words[-1][0], words[-1][1], encoding.offsets[1 + position][1])
        else:
            words.append((position, *encoding.offsets[1 + position]))
    return words


def _entities(id2label: dict, text: str, encoding: Encoding, probs: np.ndarray, truncation: str) -> list[dict]:
    words = _words(encoding)
    if truncation == "truncate":  # words past the first window were not read
        words = [w for w in words if w[0] < len(probs) and probs[w[0]].any()]
    tags = [id2label[int(probs[p].argmax())] for p, _, _ in words]
    found = []
    for kind, first, last in entities(tags):
        start, end = words[first][1], words[last][2]
        score = float(np.mean([float(probs[words[i][0]].max()) for i in range(first, last + 1)]))
        found.append({"entity_group": kind, "score": score, "word": text[start:end], "start": start, "end": end})
    return found
