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


def test_teacher_scores_come_from_the_label_column_as_scores_or_margins(tmp_path, tokenizer):
    """1 + k scores are kept; k margins t_pos - t_neg_i (sentence-transformers' MarginMSE labels) become
    [0, -m_1, ...], which have the same margins; a TSV cell holds the list as JSON. They follow their rows."""
    scored = [{"anchor": f"q{i}", "positive": f"d{i}", "negative_1": "x", "negative_2": "y",
               "label": [5.0 + i, 1.0, -2.0]} for i in range(3)]
    data = load_pairs(LabelledFormat(task="embed"), tokenizer, _write(tmp_path / "s.jsonl", scored))
    assert data.teacher_scores == [[5.0, 1.0, -2.0], [6.0, 1.0, -2.0], [7.0, 1.0, -2.0]]
    assert data.collate([2, 0], tokenizer.pad_token_id)["teacher_scores"].tolist() == [[7, 1, -2], [5, 1, -2]]
    tsv = tmp_path / "m.tsv"
    tsv.write_text("anchor\tpositive\tnegative_1\tnegative_2\tlabel\nq\td\tx\ty\t[4.0, 7.5]\n")
    assert load_pairs(LabelledFormat(task="embed"), tokenizer, str(tsv)).teacher_scores == [[0.0, -4.0, -7.5]]
    plain = [{k: v for k, v in row.items() if k != "label"} for row in scored]
    assert load_pairs(LabelledFormat(task="embed"), tokenizer, _write(tmp_path / "p.jsonl", plain)).teacher_scores \
        is None


@pytest.mark.parametrize("label, problem", [([1.0], "row 2: column 'label' must hold the teacher's scores of the "
                                                    "positive and the 2 negatives"),
                                            ("high", "row 2: column 'label'"), ([1, float("nan"), 2], "row 2")])
def test_teacher_scores_of_the_wrong_shape_name_their_row(tmp_path, tokenizer, label, problem):
    rows = [{"anchor": "q", "positive": "d", "negative_1": "x", "negative_2": "y", "label": [1, 2, 3]},
            {"anchor": "q", "positive": "d", "negative_1": "x", "negative_2": "y", "label": label}]
    with pytest.raises(DataError, match=problem):
        load_pairs(LabelledFormat(task="embed"), tokenizer, _write(tmp_path / "bad.jsonl", rows))
    with pytest.raises(DataError, match="has no negative column"):
        load_pairs(LabelledFormat(task="embed"), tokenizer,
                   _write(tmp_path / "pairs.jsonl", [{"anchor": "q", "positive": "d", "label": 1}]))


def test_a_teacher_scores_every_candidate_in_row_order(tmp_path, tokenizer):
    rows = [{"anchor": f"q{i}", "positive": f"d{i}", "negative": f"n{i}"} for i in range(3)]
    seen = []

    def teacher(pairs):
        seen.extend(pairs)
        return [float(len(seen) - len(pairs) + j) for j in range(len(pairs))]

    data = load_pairs(LabelledFormat(task="embed"), tokenizer, _write(tmp_path / "t.jsonl", rows), teacher)
    assert seen == [("q0", "d0"), ("q0", "n0"), ("q1", "d1"), ("q1", "n1"), ("q2", "d2"), ("q2", "n2")]
    assert data.teacher_scores == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]


def test_tuple_columns_can_be_named(tmp_path, tokenizer):
    """--anchor_column / --positive_column / --negative_columns read a table with other names (embed and pair)."""
    from unmask.data.labelled import load_task_data

    rows = [{"query": f"q{i}", "doc": f"doc {i}", "hard": f"bad {i}", "negative_x": "ignored"} for i in range(4)]
    path = _write(tmp_path / "named.jsonl", rows)
    spec = LabelledFormat(task="embed", anchor_column="query", positive_column="doc", negative_columns="hard")
    data = load_pairs(spec, tokenizer, path)
    assert len(data) == 4 and [len(n) for n in data.negatives] == [1] * 4
    assert data.negatives[2][0] == tokenizer.encode_batch(["bad 2"])[0].ids
    ranking, _ = load_task_data(LabelledFormat(**{**spec.__dict__, "task": "pair"}), tokenizer, path, None)
    assert len(ranking) == 4 and [len(row) for row in ranking.candidates] == [2] * 4
    assert ranking.candidates[2][1] == tokenizer.encode("bad 2", add_special_tokens=False)
    with pytest.raises(DataError, match=r"row 1: column 'missing' is missing or empty"):
        load_pairs(LabelledFormat(task="embed", anchor_column="query", positive_column="missing"), tokenizer, path)


def test_a_reranker_batch_joins_pairs_as_the_tokenizer_does_and_borrows_other_positives(tmp_path, tokenizer):
    """Each anchor's own pairs are the tokenizer's pair encodings (cut longest-first as transformers cuts them);
    the next rows' positives join as negatives, except one that is the anchor's own positive or comes from the same
    anchor."""
    from unmask.data.labelled import encode_texts, load_task_data

    words = ["river", "stone", "garden", "window", "candle"]
    rows = [{"anchor": f"the question {words[i]} " * (1 + i), "positive": f"the answer {words[i % 3]} " * 9,
             "negative_1": f"a wrong answer {words[i]}"} for i in range(5)]
    rows[4]["anchor"] = rows[1]["anchor"]  # row 4 asks row 1's question; rows 0 and 3 share a positive
    spec = LabelledFormat(task="pair", max_seq_length=24, in_batch_negatives=3)
    data, _ = load_task_data(spec, tokenizer, _write(tmp_path / "rank.jsonl", rows), None)
    batch = data.collate([0, 1, 2, 3, 4], tokenizer.pad_token_id)
    assert batch["input_ids"].shape[:2] == (5, 2 + 3) and batch["labels"].tolist() == [0] * 5
    own = [(r["anchor"], d) for r in rows for d in (r["positive"], r["negative_1"])]
    ids, types, truncated = encode_texts(tokenizer, [a for a, _ in own], [d for _, d in own], 24)
    assert truncated > 0 and data.truncated == truncated
    for row in range(5):
        for column in range(2):
            pair = batch["input_ids"][row, column][batch["attention_mask"][row, column].bool()].tolist()
            assert pair == ids[row * 2 + column]
            assert batch["token_type_ids"][row, column][: len(pair)].tolist() == types[row * 2 + column]
    assert batch["candidate_mask"].tolist() == [[True, True, True, True, False],  # row 3's positive is row 0's
                                                [True, True, True, True, False],  # row 4 is row 1's question
                                                [True, True, True, True, True],
                                                [True, True, True, False, True],
                                                [True, True, True, False, True]]


def test_a_reranker_table_needs_negatives(tmp_path, tokenizer):
    from unmask.data.labelled import load_task_data

    path = _write(tmp_path / "no_neg.jsonl", [{"anchor": "q", "positive": "d"}])
    with pytest.raises(DataError, match="a cross-encoder learns from negatives too"):
        load_task_data(LabelledFormat(task="pair"), tokenizer, path, None)
