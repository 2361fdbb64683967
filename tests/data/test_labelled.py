"""Bi-encoder examples from (anchor, positive, negative...) tables: every example keeps its own negatives through
batching, and a missing cell names its row."""

from __future__ import annotations

import json

import pytest

from unmask.data.labelled import LabelledFormat, load_pairs
from unmask.errors import DataError


def _write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_tuples_keep_each_anchors_negatives_in_its_row(tmp_path, tokenizer):
    rows = [{"anchor": f"q{i}", "positive": f"doc {i}", "negative_1": f"bad {i}", "negative_2": "none"}
            for i in range(5)]
    data = load_pairs(LabelledFormat(task="embed"), tokenizer, _write(tmp_path / "t.jsonl", rows))
    assert len(data) == 5 and data.scores is None and [len(n) for n in data.negatives] == [2] * 5
    batch = data.collate([3, 1], tokenizer.pad_token_id)
    assert batch["input_ids_b"].shape[:2] == (2, 3) and batch["labels"].tolist() == [0, 1]
    ids = batch["input_ids_b"][0, 1][batch["attention_mask_b"][0, 1].bool()].tolist()
    assert ids == tokenizer.encode_batch(["bad 3"])[0].ids  # example 3's first negative, in example 3's row


def test_pairs_without_negatives_are_one_candidate_each(tmp_path, tokenizer):
    rows = [{"anchor": f"q{i}", "positive": f"doc {i}"} for i in range(3)]
    data = load_pairs(LabelledFormat(task="embed"), tokenizer, _write(tmp_path / "p.jsonl", rows))
    assert data.negatives is None
    assert data.collate([0, 1, 2], tokenizer.pad_token_id)["input_ids_b"].shape[:2] == (3, 1)


def test_a_missing_or_empty_cell_names_its_row(tmp_path, tokenizer):
    rows = [{"anchor": "q", "positive": "d", "negative": "n"}, {"anchor": "q", "positive": " ", "negative": "n"}]
    with pytest.raises(DataError, match=r"row 2: column 'positive' is missing or empty"):
        load_pairs(LabelledFormat(task="embed"), tokenizer, _write(tmp_path / "bad.jsonl", rows))
