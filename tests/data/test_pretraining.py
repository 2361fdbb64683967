"""Token cache and packing."""

from __future__ import annotations

import numpy as np

from unmask.data.pretraining import PackedDataset, build_token_cache, pack_spans


def test_pack_spans_never_cross_documents_unless_asked():
    offsets = np.array([0, 5, 7, 20])
    spans = pack_spans(offsets, 4)
    assert spans.tolist() == [[0, 4], [4, 5], [5, 7], [7, 11], [11, 15], [15, 19], [19, 20]]
    assert pack_spans(offsets, 4, cross_documents=True).tolist() == [[0, 4], [4, 8], [8, 12], [12, 16], [16, 20]]


def test_cache_is_built_once_and_sequences_are_cls_body_sep(tmp_path, tokenizer, corpus_lines):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(f'{{"text": "{line}"}}\n' for line in corpus_lines[:50]))
    cache = build_token_cache([docs], tokenizer, tmp_path / "cache", show_progress=False)
    assert build_token_cache([docs], tokenizer, tmp_path / "cache", show_progress=False) == cache
    data = PackedDataset.from_cache(cache, tokenizer, max_seq_length=8)
    expected = [tokenizer.encode(line, add_special_tokens=False) for line in corpus_lines[:50]]
    assert data.tokens() == sum(len(e) for e in expected) + 2 * len(data)
    first = data[0]
    assert first["input_ids"] == [tokenizer.cls_token_id, *expected[0][:6], tokenizer.sep_token_id]
    assert first["word_ids"][0] == -1 and first["word_ids"][-1] == -1
    enc = tokenizer.encode_batch([corpus_lines[0]], add_special_tokens=False)[0]
    # word ids follow the tokenizer's words (0-based within the sequence)
    assert first["word_ids"][1:-1] == [w - enc.word_ids[0] for w in enc.word_ids[:6]]
