"""Statistical and structural checks of BERT masking. Tolerances are >= 5 sigma of the binomial spread."""

from __future__ import annotations

import math

import pytest
import torch

from unmask.data.masking import (
    mlm_mask,
    real_token_ids,
    special_tokens_mask,
    whole_word_mask,
    whole_word_spans,
    word_ids_from_starts,
)

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIAL = (PAD, UNK, CLS, SEP, MASK)


def sigma(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def make_batch(rows: int, width: int, vocab_size: int, seed: int = 0) -> torch.Tensor:
    """[CLS] real tokens [SEP] then padding, with ragged lengths."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(len(SPECIAL), vocab_size, (rows, width), generator=g)
    lengths = torch.randint(width // 2, width + 1, (rows,), generator=g)
    for i, n in enumerate(lengths.tolist()):
        ids[i, 0], ids[i, n - 1] = CLS, SEP
        ids[i, n:] = PAD
    return ids


def split(ids, inputs, labels):
    chosen = labels != -100
    n = int(chosen.sum())
    masked = int((chosen & (inputs == MASK)).sum())
    unchanged = int((chosen & (inputs == ids)).sum())
    return chosen, n, masked / n, (n - masked - unchanged) / n, unchanged / n


@pytest.mark.parametrize("p", [0.1, 0.15, 0.3, 0.5])
def test_ratios_80_10_10(p):
    vocab_size = 21  # 16 real tokens: a random draw hits the original 1 time in 16
    ids = make_batch(2000, 128, vocab_size)
    maskable = ~torch.isin(ids, torch.tensor(SPECIAL))
    inputs, labels = mlm_mask(ids, mask_token_id=MASK, special_token_ids=SPECIAL, vocab_size=vocab_size,
                              mlm_probability=p, generator=torch.Generator().manual_seed(1))
    chosen, n, f_mask, f_random, f_unchanged = split(ids, inputs, labels)
    n_maskable = int(maskable.sum())
    assert abs(n / n_maskable - p) < 5 * sigma(p, n_maskable)
    real = vocab_size - len(SPECIAL)
    for measured, expected in [(f_mask, 0.8), (f_random, 0.1 * (real - 1) / real), (f_unchanged, 0.1 + 0.1 / real)]:
        assert abs(measured - expected) < 5 * sigma(expected, n), (measured, expected)


def test_configurable_ratios():
    ids = make_batch(1000, 128, 5000)
    inputs, labels = mlm_mask(ids, mask_token_id=MASK, special_token_ids=SPECIAL, vocab_size=5000,
                              mask_replace_prob=0.5, random_replace_prob=0.3,
                              generator=torch.Generator().manual_seed(2))
    _, n, f_mask, f_random, f_unchanged = split(ids, inputs, labels)
    real = 5000 - len(SPECIAL)
    assert abs(f_mask - 0.5) < 5 * sigma(0.5, n)
    assert abs(f_random - 0.3 * (real - 1) / real) < 5 * sigma(0.3, n)
    assert abs(f_unchanged - (0.2 + 0.3 / real)) < 5 * sigma(0.2, n)


def test_special_and_padding_never_chosen_and_labels():
    ids = make_batch(500, 64, 100)
    inputs, labels = mlm_mask(ids, mask_token_id=MASK, special_token_ids=SPECIAL, vocab_size=100,
                              mlm_probability=0.5, generator=torch.Generator().manual_seed(3))
    special = special_tokens_mask(ids, SPECIAL)
    chosen = labels != -100
    assert not (chosen & special).any()
    assert torch.equal(inputs[special], ids[special])  # specials and padding untouched
    assert torch.equal(labels[chosen], ids[chosen])  # labels are the originals, taken before corruption
    assert torch.equal(inputs[~chosen], ids[~chosen])  # nothing outside the chosen positions changes
    assert (labels[~chosen] == -100).all()


def test_random_replacements_are_real_tokens_uniformly():
    vocab_size = 21
    ids = torch.full((4000, 64), 10)  # one real token everywhere: every change is a random draw
    inputs, labels = mlm_mask(ids, mask_token_id=MASK, special_token_ids=SPECIAL, vocab_size=vocab_size,
                              mlm_probability=0.9, mask_replace_prob=0.0, random_replace_prob=1.0,
                              generator=torch.Generator().manual_seed(4))
    drawn = inputs[labels != -100]
    assert not torch.isin(drawn, torch.tensor(SPECIAL)).any()
    counts = torch.bincount(drawn, minlength=vocab_size)[len(SPECIAL):].double()
    expected = counts.sum() / 16
    assert (counts > 0).all()
    assert ((counts - expected).abs() < 5 * expected.sqrt()).all()  # uniform over the 16 real ids


def test_real_token_ids_excludes_specials():
    ids = real_token_ids(10, (0, 3, 7))
    assert ids.tolist() == [1, 2, 4, 5, 6, 8, 9]


def test_same_seed_same_mask_new_draw_new_mask():
    ids = make_batch(64, 32, 500)
    kwargs = dict(mask_token_id=MASK, special_token_ids=SPECIAL, vocab_size=500)
    a = mlm_mask(ids, generator=torch.Generator().manual_seed(7), **kwargs)
    b = mlm_mask(ids, generator=torch.Generator().manual_seed(7), **kwargs)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    g = torch.Generator().manual_seed(7)
    first, second = mlm_mask(ids, generator=g, **kwargs), mlm_mask(ids, generator=g, **kwargs)
    assert not torch.equal(first[1], second[1])


def test_bad_probabilities_are_refused():
    ids = make_batch(2, 8, 50)
    with pytest.raises(ValueError, match="mlm_probability"):
        mlm_mask(ids, mask_token_id=MASK, special_token_ids=SPECIAL, vocab_size=50, mlm_probability=1.5)
    with pytest.raises(ValueError, match="sum to at most 1"):
        mlm_mask(ids, mask_token_id=MASK, special_token_ids=SPECIAL, vocab_size=50,
                 mask_replace_prob=0.8, random_replace_prob=0.3)


def synthetic_words(n_sentences: int, seed: int = 0):
    """Rows of [CLS] words [SEP] where each word has 1-3 pieces; returns ids and word ids (-1 on specials)."""
    g = torch.Generator().manual_seed(seed)
    rows, words = [], []
    for _ in range(n_sentences):
        n_words = int(torch.randint(3, 12, (1,), generator=g))
        pieces = torch.randint(1, 4, (n_words,), generator=g).tolist()
        row_ids, row_words = [CLS], [-1]
        for w, k in enumerate(pieces):
            row_ids += torch.randint(len(SPECIAL), 1000, (k,), generator=g).tolist()
            row_words += [w] * k
        rows.append(row_ids + [SEP])
        words.append(row_words + [-1])
    width = max(map(len, rows))
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    word_ids = torch.tensor([w + [-1] * (width - len(w)) for w in words])
    return ids, word_ids


def test_whole_word_fraction_and_one_decision_per_word():
    ids, word_ids = synthetic_words(10_000)
    p = 0.15
    inputs, labels = whole_word_mask(ids, word_ids, mask_token_id=MASK, special_token_ids=SPECIAL,
                                     vocab_size=1000, mlm_probability=p, generator=torch.Generator().manual_seed(5))
    chosen = labels != -100
    n_words = chosen_words = all_masked = mixed = 0
    for row in range(ids.shape[0]):
        for w in range(int(word_ids[row].max()) + 1):
            pieces = word_ids[row] == w
            c = chosen[row, pieces]
            assert c.all() or not c.any(), "a word is chosen whole or not at all"
            n_words += 1
            if c.all():
                chosen_words += 1
                m = inputs[row, pieces] == MASK
                all_masked += bool(m.all())
                mixed += bool(m.any() and not m.all())
    assert abs(chosen_words / n_words - p) < 5 * sigma(p, n_words)
    assert mixed == 0, "one 80/10/10 decision covers all pieces of a word"
    assert abs(all_masked / chosen_words - 0.8) < 5 * sigma(0.8, chosen_words)
    assert not chosen[word_ids < 0].any()


def test_whole_word_random_and_unchanged_split():
    ids, word_ids = synthetic_words(10_000, seed=1)
    inputs, labels = whole_word_mask(ids, word_ids, mask_token_id=MASK, special_token_ids=SPECIAL,
                                     vocab_size=1000, mlm_probability=0.3, generator=torch.Generator().manual_seed(6))
    _, n, f_mask, f_random, f_unchanged = split(ids, inputs, labels)
    # piece-level fractions: words are independent of their length, so the split carries over to pieces
    assert abs(f_mask - 0.8) < 0.02 and abs(f_random - 0.1) < 0.015 and abs(f_unchanged - 0.1) < 0.015
    assert not torch.isin(inputs[labels != -100], torch.tensor([PAD, UNK, CLS, SEP])).any()


def test_word_ids_from_starts():
    starts = torch.tensor([[0, 1, 0, 1, 1, 0, 0]]).bool()
    maskable = torch.tensor([[0, 1, 1, 1, 1, 1, 0]]).bool()
    assert word_ids_from_starts(starts, maskable).tolist() == [[-1, 0, 0, 1, 2, 2, -1]]


def test_whole_word_spans_lesson_example():
    pieces = ["the", "un", "##believ", "##able", "cat", "play", "##ed"]
    assert whole_word_spans(pieces) == ["the", "un ##believ ##able", "cat", "play ##ed"]
    assert whole_word_spans([]) == []
