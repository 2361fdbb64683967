"""What every architecture shares: output records, input checks, and the losses of the output heads.

`IGNORE_INDEX` (-100, cross-entropy's default) marks every position a loss skips: unmasked tokens in MLM, the
non-first pieces of a word in tagging, padding everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from unmask.errors import UsageError

IGNORE_INDEX = -100


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (B, T, H); (M, H) at the rows of `output_mask` when one is given
    pooler_output: torch.Tensor | None = None  # (B, H)


@dataclass
class MaskedLMOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor  # (B, T, V); with sparse_prediction, (M, V) at `predicted_positions` only
    # sparse_prediction: (B, T) bool, where the M rows of logits come from, in row-major order: the labelled
    # positions and a few unlabelled ones (label -100) that keep M at one of a few sizes (`prediction_rows`)
    predicted_positions: torch.Tensor | None = None


@dataclass
class ClassifierOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor  # (B, num_labels) per sequence, or (B, T, num_labels) per token


def classification_loss(logits: torch.Tensor, labels: torch.Tensor, num_labels: int) -> torch.Tensor:
    """MSE for one regression output (float targets), cross-entropy otherwise (-100 ignored), as HF decides it."""
    if num_labels == 1:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.reshape(-1, num_labels).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX)


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over positions whose label is not -100.

    Args:
        logits: (..., V) scores, either for every position (B, T, V) or already gathered (N, V).
        labels: (...) original ids, -100 where the position is not predicted.
    """
    logits, labels = logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1)
    if not bool((labels != IGNORE_INDEX).any()):
        return logits.sum() * 0.0  # nothing labelled (a short batch): a zero that keeps the graph, not NaN
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)


def prediction_rows(labels: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) bool: where a sparse MLM head predicts. The labelled positions, plus the first few unlabelled real
    tokens (label -100, so the loss and every gradient are unchanged) that round their count M up to a multiple of
    2^(bits(M) - 5): one of a handful of sizes near M, under 1/16 (on average ~1/32) more rows.

    Why: M changes with every batch, and with it the size of the (M, V) logits, their fp32 copy, softmax and
    gradients, tens of MB each. On the CPU glibc then rarely finds last step's blocks the right size: it grows the
    heap and the kernel zero-fills fresh pages every step, slowing a step by a third (BENCHMARKS.md).
    """
    labelled = labels != IGNORE_INDEX  # (B, T)
    count = int(labelled.sum())
    extra = -count % (1 << max(0, count.bit_length() - 5))
    if extra == 0:
        return labelled
    spare = ~labelled if attention_mask is None else ~labelled & attention_mask.bool()
    first_spare = spare & (spare.flatten().cumsum(0) <= extra).view_as(spare)
    return labelled | first_spare


def check_inputs(config, input_ids: torch.Tensor) -> None:
    """Clear errors instead of an index error deep inside an embedding lookup."""
    if input_ids.dim() != 2:
        raise UsageError(f"input_ids must be (batch, tokens), got shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] > config.max_position_embeddings:
        raise UsageError(f"input of {input_ids.shape[1]} tokens is longer than the model's context of "
                         f"{config.max_position_embeddings} (max_position_embeddings); chunk or truncate it first")
    if input_ids.numel() and (int(input_ids.max()) >= config.vocab_size or int(input_ids.min()) < 0):
        raise UsageError(f"token id {int(input_ids.max())} is outside the model's vocabulary of {config.vocab_size}:"
                         " the tokenizer does not match the model")


def check_output_mask(output_mask: torch.Tensor, attention_mask: torch.Tensor) -> None:
    """The positions asked for (the labelled ones under a sparse head) must be real tokens."""
    if output_mask.shape != attention_mask.shape:
        raise UsageError(f"output_mask (the labels) is {tuple(output_mask.shape)}, the input "
                         f"{tuple(attention_mask.shape)}")
    if bool((output_mask & ~attention_mask.bool()).any()):
        raise UsageError("labels mark padding positions (attention_mask 0): label real tokens only")
