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


def test_a_long_line_is_cut_at_spaces_into_the_same_tokens(tmp_path, tokenizer, corpus_lines, monkeypatch):
    import unmask.data.pretraining as pretraining

    monkeypatch.setattr(pretraining, "_LINE_CHARS", 500)  # cut a ~25k-character line into ~50 pieces
    line = " ".join(corpus_lines[:400])
    (tmp_path / "one_line.txt").write_text(line)
    cache = build_token_cache([tmp_path / "one_line.txt"], tokenizer, tmp_path / "cache", show_progress=False)
    data = PackedDataset.from_cache(cache, tokenizer, max_seq_length=1 << 16)
    whole = tokenizer.encode_batch([line], add_special_tokens=False)[0]
    assert data[0]["input_ids"][1:-1] == whole.ids
    assert data[0]["word_ids"][1:-1] == [w - whole.word_ids[0] for w in whole.word_ids]


def test_building_a_cache_holds_a_bounded_amount_of_memory(tmp_path, tokenizer_dir):
    """An 8 MB single line: tokenized piece by piece and written as it goes, the build's peak memory stays far
    below what holding its tokens as Python lists took (~1.1 GB before; BENCHMARKS.md has the 50 MB figures)."""
    import subprocess
    import sys

    words = "the old sailor remembered a letter from Lisbon before dawn".split()
    line = " ".join(words[i % len(words)] for i in range(1_400_000))  # ~8 MB, ~1.4M tokens
    (tmp_path / "one_line.txt").write_text(line)
    script = ("import resource, sys; from unmask.data.pretraining import build_token_cache; "
              "from unmask.tokenizer import Tokenizer; t = Tokenizer.from_pretrained(sys.argv[1]); "
              "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
              "build_token_cache([sys.argv[2]], t, sys.argv[3], show_progress=False); "
              "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)")
    done = subprocess.run([sys.executable, "-c", script, str(tokenizer_dir),
                           str(tmp_path / "one_line.txt"), str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 300, f"the build grew the process by {done.stdout} MB"
