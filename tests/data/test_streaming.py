"""The streamed corpus: the cache's packing, the same stream for any number of workers, disjoint ranks, an exact
position to resume from, bad shards named or skipped, memory bounded."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from collections import Counter

import numpy as np
import pytest
import torch

from unmask.data import pretraining
from unmask.data.pretraining import PackedDataset, build_token_cache, packed_sequence
from unmask.data.streaming import TokenStream, file_order
from unmask.errors import DataError


@pytest.fixture()
def shards(tmp_path, corpus_lines):
    """A book, a JSONL file of short documents and a gzip file: three formats, many documents."""
    book = tmp_path / "book.txt"
    book.write_text("\n".join(corpus_lines[:150]) + "\n")
    notes = tmp_path / "notes.jsonl"
    documents = [" ".join(corpus_lines[i : i + 3]) for i in range(150, 300, 3)]
    notes.write_text("".join(json.dumps({"text": text}) + "\n" for text in documents))
    packed = tmp_path / "more.txt.gz"
    packed.write_bytes(gzip.compress(("\n".join(corpus_lines[300:]) + "\n").encode()))
    return [str(book), str(notes), str(packed)]


def _key(example: dict) -> tuple:
    return tuple(example["input_ids"]) + tuple(example["word_ids"])


def _one_epoch(stream: TokenStream) -> list[tuple]:
    """Every sequence of the first epoch, in the order it was packed."""
    while stream._pull():
        pass
    cls, sep = stream.tokenizer.cls_token_id, stream.tokenizer.sep_token_id
    return [_key(packed_sequence(ids, starts, cls, sep)) for ids, starts in stream.buffer]


@pytest.mark.parametrize("cross_documents", [False, True])
def test_packing_is_the_caches(shards, tokenizer, tmp_path, cross_documents, monkeypatch):
    monkeypatch.setattr(pretraining, "_BATCH_CHARS", 2_000)  # documents of several blocks each
    in_order = [shards[i] for i in file_order(len(shards), 0, 0)]  # the epoch's file order
    cache = build_token_cache(in_order, tokenizer, tmp_path / "cache", show_progress=False)
    cached = PackedDataset.from_cache(cache, tokenizer, 24, cross_documents)
    expected = [_key(cached[i]) for i in range(len(cached))]
    streamed = _one_epoch(TokenStream(shards, tokenizer, 24, cross_documents=cross_documents, workers=2,
                                      buffer_size=10**9))
    assert len(expected) > 100
    assert streamed == expected  # the same spans, in the same order, before the shuffle buffer draws


def test_the_stream_is_the_same_for_any_number_of_workers(shards, tokenizer, monkeypatch):
    monkeypatch.setattr(pretraining, "_BATCH_CHARS", 2_000)
    draws = [TokenStream(shards, tokenizer, 24, workers=w, buffer_size=50, seed=3).take(400) for w in (0, 1, 3)]
    keys = [[_key(e) for e in d] for d in draws]
    assert keys[0] == keys[1] == keys[2]
    assert len(set(keys[0])) > 200  # and it is shuffled: not one document after the other
    assert keys[0][:20] != _one_epoch(TokenStream(shards, tokenizer, 24, workers=0, buffer_size=10**9))[:20]


def test_an_epoch_is_drawn_whole_before_the_next_is_read(shards, tokenizer):
    """A corpus smaller than the buffer: each epoch's sequences are drawn (shuffled) before the next epoch opens,
    not one sequence per reopened epoch."""
    epoch = Counter(_one_epoch(TokenStream(shards, tokenizer, 24, workers=0, buffer_size=10**9)))
    stream = TokenStream(shards, tokenizer, 24, workers=0, buffer_size=10**9, seed=5)
    size = sum(epoch.values())
    first = [_key(e) for e in stream.take(size)]
    assert Counter(first) == epoch and stream.epoch == 1 and not stream.buffer
    second = [_key(e) for e in stream.take(size)]
    assert Counter(second) == epoch and stream.epoch == 2 and second != first


def test_ranks_read_disjoint_documents_that_cover_the_corpus(shards, tokenizer):
    whole = Counter(_one_epoch(TokenStream(shards, tokenizer, 24, workers=0, buffer_size=10**9)))
    parts = [Counter(_one_epoch(TokenStream(shards, tokenizer, 24, rank=r, world_size=2, workers=1,
                                            buffer_size=10**9))) for r in (0, 1)]
    assert parts[0] + parts[1] == whole
    assert min(sum(p.values()) for p in parts) > 0.3 * sum(whole.values())  # both ranks have a fair share
    # the documents themselves are split: no JSONL line's spans go to both ranks
    assert not set(parts[0]) & set(parts[1]) - {k for k, n in whole.items() if n > 1}


@pytest.mark.parametrize("taken", [7, 130, 900])  # mid-block, mid-document, after the first epoch
def test_a_restored_position_continues_the_stream_exactly(shards, tokenizer, tmp_path, taken, monkeypatch):
    monkeypatch.setattr(pretraining, "_BATCH_CHARS", 2_000)
    settings = dict(workers=2, buffer_size=40, seed=1)
    straight = TokenStream(shards, tokenizer, 24, **settings)
    expected = [_key(e) for e in straight.take(taken + 150)][taken:]
    first = TokenStream(shards, tokenizer, 24, **settings)
    first.take(taken)
    torch.save(first.state_dict(), tmp_path / "state.pt")
    first.close()
    resumed = TokenStream(shards, tokenizer, 24, **{**settings, "workers": 1})
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert [_key(e) for e in resumed.take(150)] == expected


def test_a_position_from_other_files_is_refused(shards, tokenizer):
    state = TokenStream(shards, tokenizer, 24, workers=0, buffer_size=10).state_dict()
    with pytest.raises(DataError, match="not those the checkpoint's run streamed"):
        TokenStream(shards[:2], tokenizer, 24, workers=0).load_state_dict(state)


def test_a_bad_shard_is_named_or_skipped_and_counted(shards, tokenizer, tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(pretraining, "_BATCH_CHARS", 2_000)  # the blocks read before the damage are kept
    broken = tmp_path / "broken.txt.gz"
    whole = gzip.compress("".join(f"line {i} reads {i * i} words\n" for i in range(200_000)).encode())
    broken.write_bytes(whole[: len(whole) // 2])  # truncated mid-stream
    files = shards + [str(broken)]
    with pytest.raises(DataError, match=r"broken\.txt\.gz.*--skip_bad_files"):
        _one_epoch(TokenStream(files, tokenizer, 24, workers=1, buffer_size=10**9))
    stream = TokenStream(files, tokenizer, 24, workers=1, buffer_size=10**9, skip_bad_files=True)
    got = Counter(_one_epoch(stream))
    assert len(stream.skipped) == 1 and "broken.txt.gz" in stream.skipped[0]
    assert "skipped the rest of a file (1 so far)" in capfd.readouterr().err
    intact = Counter(_one_epoch(TokenStream(shards, tokenizer, 24, workers=0, buffer_size=10**9)))
    assert got - intact and not intact - got  # every intact shard's sequences, plus the broken one's readable part


def test_streaming_holds_a_bounded_amount_of_memory(tmp_path, tokenizer, corpus_lines):
    big = tmp_path / "big.txt"
    with open(big, "w") as f:
        for _ in range(300):  # about 6 MB in one document
            f.write("\n".join(corpus_lines) + "\n")
    stream = TokenStream([str(big)], tokenizer, 64, workers=0, buffer_size=500)
    tracemalloc.start()
    for _ in range(8):
        stream.take(2_000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert stream.epoch == 0 and stream.after.block >= 3  # read on through several blocks of the one document
    assert peak < 40e6, peak  # a block's tokens and the buffer, not the document (a cache would be 2 x 4 MB here)
    assert np.mean([len(ids) for ids, _ in stream.buffer]) == 62
