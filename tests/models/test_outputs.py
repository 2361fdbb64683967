"""The sparse MLM head's rows: the labelled positions, rounded up to one of a few sizes with unlabelled real ones."""

from __future__ import annotations

import torch

from unmask.models.outputs import prediction_rows


def test_rows_keep_every_label_add_only_real_unlabelled_tokens_and_round_the_count():
    g = torch.Generator().manual_seed(0)
    attention_mask = torch.ones(32, 128, dtype=torch.long)
    attention_mask[::3, 100:] = 0  # some padding, never to be chosen
    for count in [1, 5, 31, 32, 33, 100, 615, 1000, 2047]:
        real = attention_mask.flatten().nonzero().squeeze(1)
        chosen = real[torch.randperm(len(real), generator=g)[:count]]
        labels = torch.full((32 * 128,), -100)
        labels[chosen] = 7
        labels = labels.view(32, 128)
        rows = prediction_rows(labels, attention_mask)
        labelled = labels != -100
        assert rows[labelled].all()  # every label is predicted
        assert not rows[attention_mask == 0].any()  # no padding
        m = int(rows.sum())
        granule = 1 << max(0, count.bit_length() - 5)
        assert m % granule == 0 and count <= m < count + granule and m - count < count / 16 + 1
    assert prediction_rows(torch.full((2, 4), -100)).sum() == 0  # nothing labelled: nothing predicted


def test_nearby_counts_share_a_few_sizes():
    """The point of rounding: the counts a batch of 32 x 128 at 15% masking draws (~615 +- 25) map to ~3 sizes."""
    attention_mask = torch.ones(32, 128, dtype=torch.long)
    sizes = set()
    for count in range(560, 670):
        labels = torch.full((32 * 128,), -100)
        labels[:count] = 3
        sizes.add(int(prediction_rows(labels.view(32, 128), attention_mask).sum()))
    assert sizes == {576, 608, 640, 672}


def test_too_few_spare_tokens_takes_what_there_is():
    labels = torch.full((1, 40), -100)
    labels[0, :39] = 1  # 39 labelled: rounds to 40, one spare exists
    attention_mask = torch.ones(1, 40, dtype=torch.long)
    assert prediction_rows(labels, attention_mask).all()
    attention_mask[0, 39] = 0  # the only spare is padding: nothing to add
    assert torch.equal(prediction_rows(labels, attention_mask), labels != -100)
