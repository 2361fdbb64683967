"""Dynamic masking collator, and whole-word masking through real tokenizers of three families."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from unmask.data.collate import MLMCollator, pad_batch
from unmask.tokenizer import Tokenizer


def examples_from(tokenizer, texts):
    return [{"input_ids": e.ids, "word_ids": e.word_ids} for e in tokenizer.encode_batch(texts)]


def test_pad_batch():
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_value=0, pad_to_multiple_of=4)
    assert ids.tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]


def test_collator_pads_masks_and_never_touches_padding(tokenizer, corpus_lines):
    collate = MLMCollator.from_tokenizer(tokenizer, mlm_probability=0.5, seed=0)
    batch = collate(examples_from(tokenizer, corpus_lines[:64]))
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    assert ids.shape == mask.shape == labels.shape
    lengths = [len(e.ids) for e in tokenizer.encode_batch(corpus_lines[:64])]
    assert mask.sum(1).tolist() == lengths
    assert (labels[mask == 0] == -100).all() and (ids[mask == 0] == tokenizer.pad_token_id).all()
    special = torch.isin(ids, torch.tensor(tokenizer.special_token_ids)) & (ids != tokenizer.mask_token_id)
    assert (labels[special] == -100).all()
    assert 0.4 < (labels != -100).sum() / (mask.sum() - 2 * 64) < 0.6


def test_collator_draws_a_new_mask_every_batch_and_is_reproducible(tokenizer, corpus_lines):
    examples = examples_from(tokenizer, corpus_lines[:32])
    collate = MLMCollator.from_tokenizer(tokenizer, seed=123)
    epoch1, epoch2 = collate(examples), collate(examples)
    assert not torch.equal(epoch1["labels"], epoch2["labels"])  # dynamic: same data, new mask
    replay = MLMCollator.from_tokenizer(tokenizer, seed=123)
    assert torch.equal(replay(examples)["input_ids"], epoch1["input_ids"])
    assert torch.equal(replay(examples)["labels"], epoch2["labels"])


def test_collator_errors(tokenizer):
    collate = MLMCollator.from_tokenizer(tokenizer, whole_word_mask=True)
    with pytest.raises(ValueError, match="word_ids"):
        collate([{"input_ids": [2, 10, 3]}])
    with pytest.raises(ValueError, match="empty"):
        collate([])


def _bpe_tokenizer(lines):
    backend = BackendTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<mask>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                           show_progress=False))
    return Tokenizer(backend, {"pad_token": "<pad>", "mask_token": "<mask>"})


def _unigram_tokenizer(lines):
    backend = BackendTokenizer(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    backend.train_from_iterator(lines, trainers.UnigramTrainer(vocab_size=200, special_tokens=["<pad>", "<mask>"],
                                                               unk_token="<pad>", show_progress=False))
    return Tokenizer(backend, {"pad_token": "<pad>", "mask_token": "<mask>"})


@pytest.mark.parametrize("family", ["wordpiece", "bpe", "sentencepiece"])
def test_whole_word_masking_follows_word_ids_for_any_tokenizer(family, tokenizer, corpus_lines):
    tok = {"wordpiece": lambda: tokenizer, "bpe": lambda: _bpe_tokenizer(corpus_lines),
           "sentencepiece": lambda: _unigram_tokenizer(corpus_lines)}[family]()
    texts = ["an unbelievable storm reorganised the extraordinary manuscript"] * 200
    encodings = tok.encode_batch(texts)
    assert any(len(set(e.word_ids)) < len(e.word_ids) for e in encodings), "some word must span several pieces"
    collate = MLMCollator.from_tokenizer(tok, whole_word_mask=True, mlm_probability=0.3, seed=0)
    labels = collate(examples_from(tok, texts))["labels"]
    n_chosen_words = 0
    for row, enc in enumerate(encodings):
        for w in {w for w in enc.word_ids if w is not None}:
            positions = [i for i, x in enumerate(enc.word_ids) if x == w]
            chosen = [labels[row, i].item() != -100 for i in positions]
            assert all(chosen) or not any(chosen), f"{family}: word {w} split by the mask"
            n_chosen_words += all(chosen)
    n_words = sum(len({w for w in e.word_ids if w is not None}) for e in encodings)
    assert abs(n_chosen_words / n_words - 0.3) < 0.05
