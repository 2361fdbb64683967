"""Losses for bi-encoders (sentence embeddings), on the pooled vectors of batches of texts.

Multiple-negatives ranking (InfoNCE): anchor a_i should be nearest its positive p_i among every candidate of the
batch: all the positives and all the hard negatives (sentence-transformers' `MultipleNegativesRankingLoss`).
CoSENT: for scored pairs, every pair with a higher gold score should get a higher cosine than every pair below it.
Both use scaled cosine similarity (scale 20, as sentence-transformers does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def multiple_negatives_ranking_loss(anchors: torch.Tensor, candidates: torch.Tensor,
                                    duplicates: torch.Tensor | None = None, scale: float = 20.0,
                                    symmetric: bool = False) -> torch.Tensor:
    """anchors (B, H); candidates (C, H), the B positives first, then each column of hard negatives (C = B (1 + k)).

    -mean_i log softmax_j(s_ij)[i], s the scaled cosines of a_i and candidate j. `duplicates` (B, C) bool marks
    candidates whose text is a_i's positive, other than i itself: they are not its negatives and leave the softmax.
    `symmetric` averages the log-normaliser with the positives' own softmax over the anchors (p_i -> a_i), as
    sentence-transformers' directions ("query_to_doc", "doc_to_query") with partition_mode "per_direction"."""
    B = len(anchors)
    anchors, candidates = F.normalize(anchors, dim=-1), F.normalize(candidates, dim=-1)
    scores = (anchors @ candidates.T).float() * scale  # (B, C)
    if duplicates is not None:
        scores = scores.masked_fill(duplicates, -torch.inf)
    rows = torch.arange(B, device=scores.device)
    log_z = torch.logsumexp(scores, dim=1)  # (B,)
    if symmetric:
        backward_scores = (candidates[:B] @ anchors.T).float() * scale  # (B, B): p_i against every anchor
        log_z = (log_z + torch.logsumexp(backward_scores, dim=1)) / 2
    return -(scores[rows, rows] - log_z).mean()


def duplicate_positives(candidate_ids: torch.Tensor, batch: int) -> torch.Tensor:
    """(C, T) padded candidate ids, the `batch` positives first -> (B, C) bool: candidate j is the same text as
    positive i but not i itself (a repeated positive, or a mined negative that is another anchor's positive)."""
    rows = candidate_ids.cpu().numpy()
    where: dict[bytes, list[int]] = {}  # a text's ids -> the candidates that hold it (no (B, C, T) comparison)
    for j, row in enumerate(rows):
        where.setdefault(row.tobytes(), []).append(j)
    same = torch.zeros(batch, len(rows), dtype=torch.bool)
    for i in range(batch):
        same[i, [j for j in where[rows[i].tobytes()] if j != i]] = True
    return same.to(candidate_ids.device)


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
