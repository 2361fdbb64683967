"""Losses for bi-encoders (sentence embeddings), on the pooled vectors of batches of texts.

Multiple-negatives ranking (InfoNCE): anchor a_i should be nearest its positive p_i among every candidate of the
batch: all the positives and all the hard negatives (sentence-transformers' `MultipleNegativesRankingLoss`).
CoSENT: for scored pairs, every pair with a higher gold score should get a higher cosine than every pair below it.
Distillation: each anchor's scores of its own positive and negatives fit a teacher's (a cross-encoder's), by their
margins (MarginMSE) or as distributions (listwise KL).
All use scaled cosine similarity (scale 20, as sentence-transformers does for the first two; for distillation the
scale puts the student's scores on the range of a cross-encoder's logits).
Cross-encoder ranking: the same softmax over one anchor's candidates, scored by a cross-encoder's logits.
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F


def multiple_negatives_ranking_loss(anchors: torch.Tensor, candidates: torch.Tensor,
                                    duplicates: torch.Tensor | None = None, scale: float = 20.0,
                                    symmetric: bool = False, rows: slice | None = None,
                                    normalize: bool = True) -> torch.Tensor:
    """anchors (A, H); candidates (C, H), the A positives first, then each column of hard negatives (C = A (1 + k)).

    -mean_i log softmax_j(s_ij)[i], s the scaled cosines of a_i and candidate j, over the anchors in `rows` (default
    all; under torchrun, this rank's, against every rank's candidates). `duplicates` (rows, C) bool marks candidates
    whose text is a_i's positive, other than i itself: they are not its negatives and leave the softmax.
    `symmetric` averages the log-normaliser with the positives' own softmax over the anchors (p_i -> a_i), as
    sentence-transformers' directions ("query_to_doc", "doc_to_query") with partition_mode "per_direction".
    `normalize=False` scores raw dot products (SPLADE's sparse vectors, with scale 1)."""
    own = torch.arange(len(anchors), device=anchors.device)[rows or slice(None)]  # (b,) the anchors scored here
    if normalize:
        anchors, candidates = F.normalize(anchors, dim=-1), F.normalize(candidates, dim=-1)
    scores = (anchors[own] @ candidates.T).float() * scale  # (b, C)
    if duplicates is not None:
        scores = scores.masked_fill(duplicates, -torch.inf)
    log_z = torch.logsumexp(scores, dim=1)  # (b,)
    if symmetric:
        backward_scores = (candidates[own] @ anchors.T).float() * scale  # (b, A): p_i against every anchor
        log_z = (log_z + torch.logsumexp(backward_scores, dim=1)) / 2
    return -(scores[torch.arange(len(own)), own] - log_z).mean()


def text_keys(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(C, T) padded ids -> (C,) int64: one key per text (a 64-bit hash of its tokens, padding left out), so texts
    can be compared across batches and ranks without their (C, T) ids."""
    keys = [int.from_bytes(hashlib.blake2b(row[: int(n)].tobytes(), digest_size=8).digest(), "little", signed=True)
            for row, n in zip(input_ids.cpu().numpy(), attention_mask.sum(1).tolist())]
    return torch.tensor(keys, dtype=torch.int64, device=input_ids.device)


def duplicate_positives(keys: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """(C,) candidate text keys, (b,) the positions of b anchors' positives among them -> (b, C) bool: candidate j
    is the same text as anchor i's positive but not that positive itself (a repeated positive, or a mined negative
    that is another anchor's positive)."""
    same = keys[None, :] == keys[positives][:, None]  # (b, C)
    same[torch.arange(len(positives)), positives] = False
    return same


def flops(vectors: torch.Tensor) -> torch.Tensor:
    """FLOPS regularisation (Paria et al. 2020, SPLADE's): sum over dimensions of the squared mean absolute weight
    over the batch; it pushes whole vocabulary entries to zero, which is what keeps an inverted index fast."""
    return (vectors.abs().float().mean(dim=0) ** 2).sum()


def cosent_loss(a: torch.Tensor, b: torch.Tensor, labels: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """log(1 + sum over pairs (i, j) with label_i > label_j of exp(s_j - s_i)), s the scaled cosines."""
    s = F.cosine_similarity(a, b, dim=-1).float() * scale  # (B,)
    diff = s[None, :] - s[:, None]  # (B, B): s_j - s_i
    ordered = labels[:, None] > labels[None, :]  # i should beat j
    diff = diff[ordered]
    return torch.logsumexp(torch.cat([diff.new_zeros(1), diff]), dim=0)


def candidate_scores(anchors: torch.Tensor, candidates: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """anchors (B, H), candidates (B, 1 + k, H) -> (B, 1 + k) scaled cosines of each anchor with its own positive
    and negatives: the student's scores that distillation fits to a teacher's."""
    anchors, candidates = F.normalize(anchors, dim=-1), F.normalize(candidates, dim=-1)
    return torch.einsum("bh,bnh->bn", anchors, candidates).float() * scale


def margin_mse_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """MarginMSE (Hofstaetter et al.): (B, 1 + k) scores, positive first; the student's margins s_pos - s_neg_i
    regress onto the teacher's t_pos - t_neg_i (mean over rows and negatives)."""
    margins = student[:, :1] - student[:, 1:]
    return F.mse_loss(margins, (teacher[:, :1] - teacher[:, 1:]).to(margins.dtype))


def kl_distillation_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Listwise distillation: KL(softmax(teacher) || softmax(student)) over each row's 1 + k candidates, averaged
    over the rows (sentence-transformers' DistillKLDivLoss at temperature 1)."""
    log_q = torch.log_softmax(student.float(), dim=1)
    return F.kl_div(log_q, torch.softmax(teacher.float(), dim=1), reduction="batchmean")


def cross_encoder_ranking_loss(logits: torch.Tensor, valid: torch.Tensor | None = None,
                               scale: float = 10.0) -> torch.Tensor:
    """logits (B, n): a cross-encoder's relevance logit of each anchor's candidates, its positive first.

    -mean_i log softmax_j(scale * sigmoid(l_ij))[0] (sentence-transformers' cross-encoder
    MultipleNegativesRankingLoss): the sigmoid bounds each score, so a confident pair stops pulling and the logit stays
    a probability's log-odds. `valid` (B, n) bool: False drops a candidate from its row's softmax."""
    scores = torch.sigmoid(logits.float()) * scale
    if valid is not None:
        scores = scores.masked_fill(~valid, -torch.inf)
    return -torch.log_softmax(scores, dim=1)[:, 0].mean()
