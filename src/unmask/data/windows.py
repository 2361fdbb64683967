"""Inputs longer than the model's context: refuse them, cut them, or split them into overlapping windows.

    error     raise, naming the input and its length
    truncate  keep the first window only (the closing [SEP] kept), with a warning that counts the inputs cut
    chunk     overlapping windows over the input's content, neighbours sharing `stride` tokens (HF's meaning of
              stride); every window is `[CLS] content [SEP]`, or `[CLS] query [SEP] content [SEP]` for a pair, whose
              second segment is the one split. The caller combines the windows' results: `mean_by_owner` (logits,
              vectors) or `most_central` (per-token results: each token from the window where it is furthest
              from an edge).

Pure functions on token ids; no model here.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from unmask.errors import UsageError

TRUNCATION = ("error", "truncate", "chunk")


@dataclass
class Windows:
    input_ids: list[list[int]] = field(default_factory=list)  # model inputs, each at most max_length tokens
    token_type_ids: list[list[int]] = field(default_factory=list)
    owner: list[int] = field(default_factory=list)  # the input each window comes from
    offset: list[int] = field(default_factory=list)  # where the window's content starts in its input's content
    content_start: list[int] = field(default_factory=list)  # where the content starts in the window's ids
    content_length: list[int] = field(default_factory=list)
    longer: int = 0  # inputs that did not fit (cut or split)

    def __len__(self) -> int:
        return len(self.input_ids)


def window_starts(n: int, size: int, stride: int) -> list[int]:
    """Start of each window of `size` tokens over `n`, consecutive windows overlapping by `stride`; the last one
    ends at `n` exactly (so no window is short and every token is covered)."""
    if n <= size:
        return [0]
    step = max(1, size - stride)
    starts = list(range(0, n - size, step))
    return starts + [n - size]


def make_windows(encodings: list[tuple[list[int], list[int]]], max_length: int, truncation: str = "chunk",
                 stride: int | None = None) -> Windows:
    """`encodings` are (ids, token types) of `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`; see the module doc."""
    if truncation not in TRUNCATION:
        raise UsageError(f"truncation must be one of {', '.join(TRUNCATION)}, got {truncation!r}")
    out = Windows()
    for i, (ids, types) in enumerate(encodings):
        split = types.index(1) if any(types) else 1  # the content is the last segment
        head, content, tail = ids[:split], ids[split:-1], ids[-1:]
        size = max_length - len(head) - len(tail)
        if len(ids) > max_length:
            if truncation == "error":
                raise UsageError(f"input {i} is {len(ids)} tokens, longer than the context of {max_length}; "
                                 "pass truncation 'chunk' (windows) or 'truncate'")
            if size < 1:
                raise UsageError(f"input {i}: its first segment alone ({len(head) - 1} tokens) fills the context "
                                 f"of {max_length}")
            if truncation == "chunk" and stride is not None and not 0 <= stride < size:
                raise UsageError(f"stride {stride} must be smaller than the window's {size} content tokens")
            out.longer += 1
        # default: a quarter of the context, or of the window where a long first segment leaves less room
        overlap = stride if stride is not None else max_length // 4 if max_length // 4 < size else size // 4
        starts = window_starts(len(content), size, overlap)
        if truncation != "chunk":
            starts = starts[:1]
        for start in starts:
            piece = content[start : start + size]
            out.input_ids.append(head + piece + tail)
            out.token_type_ids.append(types[:split] + types[split : split + len(piece)] + types[-1:])
            out.owner.append(i)
            out.offset.append(start)
            out.content_start.append(len(head))
            out.content_length.append(len(piece))
    if out.longer and truncation == "truncate":
        warnings.warn(f"{out.longer} of {len(encodings)} inputs were longer than the context of {max_length} "
                      "tokens and were truncated (truncation='chunk' reads them whole)", stacklevel=3)
    return out


def mean_by_owner(values: np.ndarray, owner: list[int], n_inputs: int) -> np.ndarray:
    """(windows, ...) -> (inputs, ...): the mean over each input's windows."""
    owner_arr = np.asarray(owner)
    sums = np.zeros((n_inputs, *values.shape[1:]), dtype=np.float64)
    np.add.at(sums, owner_arr, values)
    counts = np.bincount(owner_arr, minlength=n_inputs).reshape(-1, *([1] * (values.ndim - 1)))
    return (sums / counts).astype(values.dtype)


def most_central(windows: Windows, per_token: list[np.ndarray], n_content: list[int]) -> list[np.ndarray]:
    """Per input, (content tokens, ...) taken for each token from the window where it is most central.

    `per_token[w]` holds window w's results for all its ids (specials included); `n_content[i]` is the length of
    input i's content."""
    best: list[np.ndarray | None] = [None] * len(n_content)
    margin = [np.full(n, -1) for n in n_content]
    for w, values in enumerate(per_token):
        i, start, length, first = (windows.owner[w], windows.offset[w], windows.content_length[w],
                                   windows.content_start[w])
        if best[i] is None:
            best[i] = np.zeros((n_content[i], *values.shape[1:]), dtype=values.dtype)
        local = np.arange(length)
        distance = np.minimum(local, length - 1 - local)  # to the nearer edge of the window
        take = distance > margin[i][start : start + length]
        positions = start + local[take]
        best[i][positions] = values[first + local[take]]
        margin[i][positions] = distance[take]
    return best
