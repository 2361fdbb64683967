"""Tokenizer training, saving and loading, checked against transformers.AutoTokenizer."""

from __future__ import annotations

import gzip
import json

import pytest

from unmask.errors import DataError
from unmask.tokenizer import SPECIAL_TOKENS, Tokenizer, train_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = [
    "The old sailor remembered the lighthouse by the harbour.",
    "an UNBELIEVABLE storm — naïvely, twice!",
    "Professor Whitfield photographed the café on Rue Lepic at 3.5 hours past noon.",
    "zyxwvut qqqq unseenwordpieces 12345",
    "",
    "   spaced    out   ",
    "中文 字符 and émojis 🙂",
]


def test_saved_directory_has_hf_files_and_special_ids(tokenizer_dir, tokenizer):
    for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"]:
        assert (tokenizer_dir / name).is_file(), name
    assert [tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id,
            tokenizer.mask_token_id] == [0, 1, 2, 3, 4]
    assert tokenizer.special_token_ids == (0, 1, 2, 3, 4)
    vocab = (tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert vocab[:5] == list(SPECIAL_TOKENS) and len(vocab) == tokenizer.vocab_size == 300


def test_auto_tokenizer_encodes_identically(tokenizer_dir, tokenizer):
    hf = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ours = tokenizer.encode_batch(TEXTS)
    theirs = hf(TEXTS)["input_ids"]
    assert [e.ids for e in ours] == theirs
    pair_ours = tokenizer.encode_batch([(TEXTS[0], TEXTS[1])])[0]
    pair_theirs = hf(TEXTS[0], TEXTS[1])
    assert pair_ours.ids == pair_theirs["input_ids"] and pair_ours.type_ids == pair_theirs["token_type_ids"]
    assert hf.mask_token_id == tokenizer.mask_token_id and hf.pad_token_id == tokenizer.pad_token_id
    assert hf.convert_ids_to_tokens(ours[0].ids) == tokenizer.convert_ids_to_tokens(ours[0].ids)


def test_lowercase_option(corpus_file, tmp_path):
    cased = train_tokenizer([corpus_file], vocab_size=300, lowercase=False, min_frequency=1, show_progress=False,
                            output_dir=tmp_path)
    assert cased.encode("The", add_special_tokens=False) != cased.encode("the", add_special_tokens=False)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf(TEXTS)["input_ids"] == [e.ids for e in cased.encode_batch(TEXTS)]


def test_reads_jsonl_and_gzip(corpus_lines, tmp_path):
    jsonl = tmp_path / "docs.jsonl.gz"
    with gzip.open(jsonl, "wt", encoding="utf-8") as f:
        for line in corpus_lines:
            f.write(json.dumps({"body": line, "id": 1}) + "\n")
    plain = tmp_path / "more.txt.gz"
    with gzip.open(plain, "wt", encoding="utf-8") as f:
        f.write("\n".join(corpus_lines))
    tok = train_tokenizer([jsonl, plain], vocab_size=250, text_field="body", min_frequency=1, show_progress=False)
    assert tok.vocab_size == 250
    assert tok.convert_ids_to_tokens(tok.encode("sailor", add_special_tokens=False)) == ["sailor"]


def test_loads_the_minilm_directory_without_truncating(minilm_dir):
    ours = Tokenizer.from_pretrained(minilm_dir)
    hf = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    assert ours.vocab_size == 30522 and ours.mask_token_id == 103 and ours.pad_token_id == 0
    assert ours.model_max_length == 512 and ours.lowercase is True
    assert [e.ids for e in ours.encode_batch(TEXTS)] == hf(TEXTS)["input_ids"]
    long_text = "word " * 300  # its tokenizer.json truncates at 128 on its own; we never cut silently
    assert len(ours.encode(long_text)) == 302


def test_roundtrip_of_a_loaded_directory(minilm_dir, tmp_path):
    Tokenizer.from_pretrained(minilm_dir).save_pretrained(tmp_path)
    again = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert again(TEXTS)["input_ids"] == [e.ids for e in Tokenizer.from_pretrained(minilm_dir).encode_batch(TEXTS)]


def test_vocab_txt_only_directory(tokenizer_dir, tmp_path, tokenizer):
    (tmp_path / "vocab.txt").write_bytes((tokenizer_dir / "vocab.txt").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    legacy = Tokenizer.from_pretrained(tmp_path)
    assert [e.ids for e in legacy.encode_batch(TEXTS)] == [e.ids for e in tokenizer.encode_batch(TEXTS)]


def test_clear_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        Tokenizer.from_pretrained(tmp_path / "missing")
    with pytest.raises(DataError, match="no tokenizer.json or vocab.txt"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(DataError, match="not a valid tokenizer file"):
        Tokenizer.from_pretrained(tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match="no text to train a tokenizer on"):
        train_tokenizer([empty], vocab_size=100, show_progress=False)
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer([empty], vocab_size=3, show_progress=False)


def test_training_is_deterministic_and_word_pieces_are_not_special(tmp_path, corpus_file):
    """Same files, same arguments: the same vocabulary every run (`tokenizers`' trainer alone gives its `##`
    pieces ids in hash-map order, and ties between merges then go either way)."""
    vocabularies = []
    for _ in range(6):
        tokenizer = train_tokenizer([corpus_file], vocab_size=200, min_frequency=1, show_progress=False)
        vocabularies.append(tokenizer.backend.get_vocab())
    assert all(v == vocabularies[0] for v in vocabularies)
    assert len(vocabularies[0]) == 200
    added = tokenizer.backend.get_added_tokens_decoder()
    assert sorted(t.content for t in added.values()) == sorted(SPECIAL_TOKENS)
    pieces = tokenizer.encode("unbelievably reorganised", add_special_tokens=False)
    assert any(tokenizer.convert_ids_to_tokens([i])[0].startswith("##") for i in pieces)
    assert tokenizer.decode(pieces) == "unbelievably reorganised"  # no piece is dropped as special
