"""Multiple-negatives ranking: the loss and gradients of sentence-transformers' MultipleNegativesRankingLoss (hard
negatives, the symmetric form), and a repeated positive is never a negative."""

from __future__ import annotations

import pytest
import torch

from unmask.objectives.contrastive import duplicate_positives, multiple_negatives_ranking_loss, text_keys


def _embeddings(seed: int, batch: int = 8, negatives: int = 2, width: int = 16) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, width, generator=generator, requires_grad=True) for _ in range(2 + negatives)]


@pytest.mark.parametrize("symmetric", [False, True])
def test_the_loss_and_gradients_are_sentence_transformers(symmetric):
    losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    options = {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"} if symmetric else {}
    theirs_fn = losses.MultipleNegativesRankingLoss(model=None, scale=20.0, **options)
    ours_in, theirs_in = _embeddings(0), _embeddings(0)
    ours = multiple_negatives_ranking_loss(ours_in[0], torch.cat(ours_in[1:]), symmetric=symmetric)
    theirs = theirs_fn.compute_loss_from_embeddings(theirs_in, labels=None)
    ours.backward()
    theirs.backward()
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
    for mine, reference in zip(ours_in, theirs_in):
        assert torch.allclose(mine.grad, reference.grad, atol=1e-7)


def test_a_repeated_positive_leaves_the_softmax():
    anchors, positives, negatives = (t.detach() for t in _embeddings(1, batch=4, negatives=1))
    candidate_ids = torch.tensor([[5, 6, 0], [7, 8, 9], [5, 6, 0], [3, 0, 0],  # positive 2 repeats positive 0
                                  [1, 2, 0], [7, 8, 9], [4, 4, 0], [2, 0, 0]])  # negative of anchor 1 = positive 1
    keys = text_keys(candidate_ids, (candidate_ids != 0).long())
    padded = torch.tensor([[5, 6, 0, 0]])  # the same text padded to another length: the same key
    assert text_keys(padded, (padded != 0).long()).item() == keys[0].item() != keys[4].item()
    same = duplicate_positives(keys, torch.arange(4))
    assert same.nonzero().tolist() == [[0, 2], [1, 5], [2, 0]]
    assert duplicate_positives(keys, torch.arange(2, 4)).nonzero().tolist() == [[0, 0]]  # another rank's anchors
    candidates = torch.cat([positives, negatives])
    loss = multiple_negatives_ranking_loss(anchors, candidates, same)
    scores = torch.nn.functional.normalize(anchors, dim=-1) @ torch.nn.functional.normalize(candidates, dim=-1).T * 20
    by_hand = [torch.log_softmax(scores[i][[j for j in range(8) if not same[i, j]]], 0)[i - (i == 2)]
               for i in range(4)]
    assert loss.item() == pytest.approx(-torch.stack(by_hand).mean().item(), abs=1e-6)
    assert loss < multiple_negatives_ranking_loss(anchors, candidates)  # the repeat no longer counts against it
    part = multiple_negatives_ranking_loss(anchors, candidates, same[2:], rows=slice(2, 4))  # anchors 2-3 only
    assert part.item() == pytest.approx(-torch.stack(by_hand[2:]).mean().item(), abs=1e-6)


@pytest.mark.parametrize("name", ["MarginMSELoss", "DistillKLDivLoss"])
@pytest.mark.parametrize("negatives", [1, 3])
def test_distillation_losses_and_gradients_are_sentence_transformers(name, negatives):
    """Ours on 20 x cosine = sentence-transformers' MarginMSELoss / DistillKLDivLoss given that similarity."""
    losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    from unmask.objectives.contrastive import candidate_scores, kl_distillation_loss, margin_mse_loss

    def scaled_cosine(a, b):
        return 20 * torch.nn.functional.cosine_similarity(a, b, dim=-1)

    theirs_fn = getattr(losses, name)(model=None, similarity_fct=scaled_cosine)
    teacher = torch.randn(8, 1 + negatives, generator=torch.Generator().manual_seed(3)) * 4
    ours_in, theirs_in = _embeddings(2, negatives=negatives), _embeddings(2, negatives=negatives)
    student = candidate_scores(ours_in[0], torch.stack(ours_in[1:], dim=1))  # (B, 1 + k)
    ours = (margin_mse_loss if name == "MarginMSELoss" else kl_distillation_loss)(student, teacher)
    theirs = theirs_fn.compute_loss_from_embeddings(theirs_in, labels=teacher)
    ours.backward()
    theirs.backward()
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)
    for mine, reference in zip(ours_in, theirs_in):
        assert torch.allclose(mine.grad, reference.grad, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("scale", [10.0, 5.0])
def test_the_cross_encoder_ranking_loss_is_sentence_transformers(scale):
    """= sentence-transformers' cross-encoder MultipleNegativesRankingLoss on the same logits (its calculate_loss:
    sigmoid, scale, cross-entropy on the first column), gradients included; a masked candidate leaves the softmax."""
    from types import SimpleNamespace

    losses = pytest.importorskip("sentence_transformers.cross_encoder.losses")
    from unmask.objectives.contrastive import cross_encoder_ranking_loss

    columns = [torch.randn(6, generator=torch.Generator().manual_seed(c)) * 3 for c in range(4)]  # (B,) per column
    ours_in = torch.stack(columns, dim=1).requires_grad_()  # (B, 1 + k + r)
    theirs_in = [c.clone().requires_grad_() for c in columns]
    st = SimpleNamespace(activation_fn=torch.nn.Sigmoid(), scale=scale, cross_entropy_loss=torch.nn.CrossEntropyLoss())
    theirs = losses.MultipleNegativesRankingLoss.calculate_loss(st, theirs_in, batch_size=6)
    ours = cross_encoder_ranking_loss(ours_in, scale=scale)
    ours.backward()
    theirs.backward()
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
    assert torch.allclose(ours_in.grad, torch.stack([t.grad for t in theirs_in], dim=1), atol=1e-7)
    valid = torch.ones(6, 4, dtype=torch.bool)
    valid[2, 3] = False
    scores = torch.sigmoid(ours_in.detach()) * scale
    by_hand = [torch.log_softmax(scores[i][valid[i]], 0)[0] for i in range(6)]
    masked = cross_encoder_ranking_loss(ours_in.detach(), valid, scale=scale)
    assert masked.item() == pytest.approx(-torch.stack(by_hand).mean().item(), abs=1e-6)
