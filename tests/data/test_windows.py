"""Long inputs: window placement, the three truncation modes, and how window results are combined."""

from __future__ import annotations

import numpy as np
import pytest

from unmask.data.windows import make_windows, mean_by_owner, most_central, window_starts

CLS, SEP = 2, 3


def single(n: int) -> tuple[list[int], list[int]]:
    ids = [CLS, *range(100, 100 + n), SEP]
    return ids, [0] * len(ids)


def test_window_starts_cover_everything_with_the_stride_as_overlap():
    assert window_starts(5, 8, 2) == [0]
    assert window_starts(20, 8, 2) == [0, 6, 12]  # the last window ends at 20 exactly
    assert window_starts(21, 8, 2) == [0, 6, 12, 13]
    for n, size, stride in [(100, 10, 3), (37, 12, 0), (64, 16, 15)]:
        starts = window_starts(n, size, stride)
        covered = set()
        for s in starts:
            covered |= set(range(s, s + size))
        assert covered == set(range(n)) and starts[-1] + size == n
        assert all(b - a <= size - stride for a, b in zip(starts, starts[1:]))


def test_modes_on_single_texts():
    short, long = single(4), single(20)
    windows = make_windows([short, long], max_length=10, stride=2)  # 8 content tokens per window
    assert windows.owner == [0, 1, 1, 1] and windows.offset == [0, 0, 6, 12] and windows.longer == 1
    assert all(len(w) <= 10 and w[0] == CLS and w[-1] == SEP for w in windows.input_ids)
    assert windows.input_ids[2] == [CLS, *range(106, 114), SEP]
    with pytest.warns(UserWarning, match="1 of 2 inputs were longer than the context of 10"):
        cut = make_windows([short, long], max_length=10, truncation="truncate")
    assert cut.owner == [0, 1] and cut.input_ids[1] == [CLS, *range(100, 108), SEP]
    with pytest.raises(ValueError, match="input 1 is 22 tokens, longer than the context of 10"):
        make_windows([short, long], max_length=10, truncation="error")
    with pytest.raises(ValueError, match="truncation must be one of"):
        make_windows([short], max_length=10, truncation="drop")


def test_pairs_keep_the_query_in_every_window():
    query, doc = [7, 8], list(range(200, 215))
    ids = [CLS, *query, SEP, *doc, SEP]
    types = [0] * 4 + [1] * 16
    windows = make_windows([(ids, types)], max_length=12, stride=1)  # 12 - 4 - 1 = 7 document tokens a window
    assert windows.offset == [0, 6, 8]
    for w, t in zip(windows.input_ids, windows.token_type_ids):
        assert w[:4] == [CLS, 7, 8, SEP] and w[-1] == SEP and len(w) == 12
        assert t == [0] * 4 + [1] * 8
    with pytest.raises(ValueError, match="first segment alone"):
        make_windows([([CLS, *range(20), SEP, 5, SEP], [0] * 22 + [1] * 2)], max_length=12)


def test_mean_by_owner_and_most_central():
    values = np.array([[1.0, 0.0], [0.0, 2.0], [4.0, 4.0]], dtype=np.float32)
    assert mean_by_owner(values, [0, 1, 1], 2).tolist() == [[1.0, 0.0], [2.0, 3.0]]
    _, long = single(1), single(20)
    windows = make_windows([long], max_length=10, stride=4)  # windows of 8 at offsets 0, 4, 8, 12
    assert windows.offset == [0, 4, 8, 12]
    # each window "predicts" its own index at every position: the result shows which window each token came from
    per_token = [np.full(len(ids), w, dtype=np.int64) for w, ids in enumerate(windows.input_ids)]
    chosen = most_central(windows, per_token, [20])[0]
    assert len(chosen) == 20
    for token, window in enumerate(chosen):
        start = windows.offset[window]
        margin = min(token - start, start + 7 - token)
        best = max(min(token - s, s + 7 - token) for s in windows.offset if s <= token < s + 8)
        assert margin == best, (token, window)
    assert chosen[0] == 0 and chosen[19] == 3
