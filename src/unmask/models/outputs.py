"""What every architecture shares: output records, input checks, the classification losses."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from unmask.data.masking import IGNORE_INDEX


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (B, T, H)
    pooler_output: torch.Tensor | None = None  # (B, H)


@dataclass
class MaskedLMOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor  # (B, T, V) without labels; with labels (M, V) at `predicted_positions` only
    # (B, T) bool: where the M rows of logits come from, in row-major order: the labelled positions and a few
    # unlabelled ones (label -100) that keep M at one of a few sizes (`objectives.mlm.prediction_rows`)
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


def check_inputs(config, input_ids: torch.Tensor) -> None:
    """Clear errors instead of an index error deep inside an embedding lookup."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, tokens), got shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] > config.max_position_embeddings:
        raise ValueError(f"input of {input_ids.shape[1]} tokens is longer than the model's context of "
                         f"{config.max_position_embeddings} (max_position_embeddings); chunk or truncate it first")
    if input_ids.numel() and (int(input_ids.max()) >= config.vocab_size or int(input_ids.min()) < 0):
        raise ValueError(f"token id {int(input_ids.max())} is outside the model's vocabulary of {config.vocab_size}:"
                         " the tokenizer does not match the model")


def check_output_mask(output_mask: torch.Tensor, attention_mask: torch.Tensor) -> None:
    """The positions asked for (the labelled ones under a sparse head) must be real tokens."""
    if output_mask.shape != attention_mask.shape:
        raise ValueError(f"output_mask (the labels) is {tuple(output_mask.shape)}, the input "
                         f"{tuple(attention_mask.shape)}")
    if bool((output_mask & ~attention_mask.bool()).any()):
        raise ValueError("labels mark padding positions (attention_mask 0): label real tokens only")
