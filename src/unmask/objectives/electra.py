"""ELECTRA (Clark et al., 2020): replaced-token detection, a training signal at every position.

A small generator (same depth, a fraction of the width) fills the masked positions by sampling from its MLM
distribution; the discriminator, the model we keep, reads the text with those samples in place and says for every
token whether it is the original or a replacement (a sample equal to the original counts as original).

    loss = MLM(generator) + rtd_weight * BCE(discriminator)      (rtd_weight 50, as in the paper)

Both are trained together; no gradient flows through the sampling. The generator reads the discriminator's embedding
layer (word, position and type embeddings are shared) through a projection to its width, and its output layer is the
transposed word-embedding matrix, as in HF's ElectraForMaskedLM with embedding_size > hidden_size.

The export is the discriminator alone as a plain encoder directory (BertModel / ModernBertModel layout): `transformers`
AutoModel and `unmask finetune` load it as they load an MLM-pretrained encoder. The generator and the detection head
sit beside it in `electra.safetensors`, for resuming or continuing pretraining.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from unmask.errors import CheckpointError, UsageError
from unmask.hub import load_weights, read_weights
from unmask.io import atomic_write
from unmask.models import from_config
from unmask.models.activations import gelu
from unmask.models.outputs import IGNORE_INDEX, mlm_loss, prediction_rows

EXTRA_WEIGHTS = "electra.safetensors"


def generator_config(config, generator_size: float):
    """The discriminator's config at `generator_size` of its width (hidden, feed-forward, heads); same depth."""
    if not 0.0 < generator_size <= 1.0:
        raise UsageError(f"--generator_size must be in (0, 1], got {generator_size}")
    heads = max(1, round(config.num_attention_heads * generator_size))
    head_dim = config.hidden_size // config.num_attention_heads
    try:
        return replace(config, hidden_size=heads * head_dim, num_attention_heads=heads,
                       intermediate_size=max(1, round(config.intermediate_size * generator_size)))
    except ValueError as e:
        raise UsageError(f"--generator_size {generator_size} gives an invalid generator config: {e}") from e


class ProjectedEmbeddings(nn.Module):
    """The discriminator's embedding layer, then a projection to the generator's width.

    The shared layer is held in a tuple so that it is not registered twice: the discriminator owns its parameters
    (one copy in the optimizer and in the state dict), the generator only calls it."""

    def __init__(self, shared: nn.Module, in_features: int, out_features: int):
        super().__init__()
        self.shared = (shared,)
        self.project = nn.Linear(in_features, out_features)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.project(self.shared[0](*inputs))  # (..., H_disc) -> (..., H_gen)


class GeneratorHead(nn.Module):
    """HF's ElectraGeneratorPredictions: back to the embedding width, then the tied vocabulary projection."""

    def __init__(self, hidden_size: int, embedding_size: int, word_embeddings: nn.Embedding, eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, embedding_size)
        self.LayerNorm = nn.LayerNorm(embedding_size, eps=eps)
        self.word_embeddings = (word_embeddings,)  # shared, owned by the discriminator
        self.bias = nn.Parameter(torch.zeros(word_embeddings.num_embeddings))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.LayerNorm(gelu(self.dense(x)))  # (N, E)
        return F.linear(x, self.word_embeddings[0].weight, self.bias)  # (N, V)


class DiscriminatorHead(nn.Module):
    """HF's ElectraDiscriminatorPredictions: one logit per token, > 0 meaning 'replaced'."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dense_prediction = nn.Linear(hidden_size, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(gelu(self.dense(x))).squeeze(-1)  # (..., H) -> (...)


@dataclass
class ElectraOutput:
    loss: torch.Tensor
    mlm_loss: torch.Tensor
    rtd_loss: torch.Tensor
    generator_logits: torch.Tensor  # (M, V) at `generator_positions`
    generator_positions: torch.Tensor  # (B, T) bool: the masked positions and a few more (label -100)
    rtd_logits: torch.Tensor  # (B, T)
    replaced: torch.Tensor  # (B, T) bool: the discriminator's targets


class ElectraPretrainer(nn.Module):
    """Generator + discriminator of one architecture (BERT or ModernBERT), trained jointly."""

    def __init__(self, config, generator_size: float = 0.25, rtd_weight: float = 50.0):
        super().__init__()
        if rtd_weight <= 0:
            raise UsageError(f"--rtd_weight must be positive, got {rtd_weight}")
        self.config, self.rtd_weight = config, rtd_weight
        self.discriminator = _without_pooler(from_config(config, "encoder"))
        self.discriminator_predictions = DiscriminatorHead(config.hidden_size)
        small = generator_config(config, generator_size)
        self.generator = _without_pooler(from_config(small, "encoder"))
        # shared embeddings: the generator's own embedding layer is replaced before it is ever used
        self.generator.embeddings = ProjectedEmbeddings(self.discriminator.embeddings, config.hidden_size,
                                                        small.hidden_size)
        eps = config.layer_norm_eps if hasattr(config, "layer_norm_eps") else config.norm_eps  # BERT / ModernBERT
        self.generator_predictions = GeneratorHead(small.hidden_size, config.hidden_size,
                                                   self.discriminator.get_input_embeddings(), eps)
        for module in (self.generator.embeddings.project, self.generator_predictions.dense,
                       self.discriminator_predictions.dense, self.discriminator_predictions.dense_prediction):
            nn.init.normal_(module.weight, std=config.initializer_range)
            nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ElectraOutput:
        """`input_ids` masked by the MLM collator, `labels` the originals at the masked positions (-100 elsewhere)."""
        if labels is None:
            raise UsageError("ELECTRA pretraining needs the collator's labels (which positions were masked)")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        masked = labels != IGNORE_INDEX  # (B, T)
        # the generator's last layer and head run at the masked positions only (and a few more, label -100)
        rows = prediction_rows(labels, attention_mask)  # (B, T)
        hidden = self.generator(input_ids, attention_mask, token_type_ids, output_mask=rows).last_hidden_state
        generator_logits = self.generator_predictions(hidden)  # (M, V) from (M, H_gen)
        row_labels = labels[rows]  # (M,)
        generator_loss = mlm_loss(generator_logits, row_labels)
        with torch.no_grad():  # sampling is not differentiable: the discriminator's loss stops here
            sampled = torch.multinomial(F.softmax(generator_logits.float(), dim=-1), 1).squeeze(-1)  # (M,)
            original = torch.where(masked, labels, input_ids)  # the text before masking
            corrupted = original.clone()
            corrupted[rows] = torch.where(row_labels != IGNORE_INDEX, sampled, original[rows])
            real = attention_mask.bool()
            replaced = (corrupted != original) & real  # a correct guess counts as original
        disc = self.discriminator(corrupted, attention_mask, token_type_ids).last_hidden_state  # (B, T, H)
        rtd_logits = self.discriminator_predictions(disc)  # (B, T)
        rtd_loss = F.binary_cross_entropy_with_logits(rtd_logits[real].float(), replaced[real].float())
        loss = generator_loss + self.rtd_weight * rtd_loss
        return ElectraOutput(loss, generator_loss.detach(), rtd_loss.detach(), generator_logits, rows, rtd_logits,
                             replaced)

    def _extra_state(self) -> dict[str, torch.Tensor]:
        """Everything but the discriminator encoder (which is the exported model)."""
        return {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()
                if not k.startswith("discriminator.")}

    def save_pretrained(self, output_dir: str | Path, tokenizer=None) -> Path:
        output_dir = self.discriminator.save_pretrained(output_dir, tokenizer=tokenizer)
        extra = self._extra_state()
        atomic_write(output_dir / EXTRA_WEIGHTS, lambda tmp: save_file(extra, str(tmp), metadata={"format": "pt"}))
        return output_dir

    def restore_weights(self, path: Path) -> None:
        """Load what `save_pretrained` wrote (resuming from a checkpoint)."""
        load_weights(self.discriminator, read_weights(path), str(path))
        extra_file = Path(path) / EXTRA_WEIGHTS
        if not extra_file.exists():
            raise CheckpointError(f"{extra_file}: missing; {path} holds no ELECTRA generator to resume from")
        missing, unexpected = self.load_state_dict(load_file(str(extra_file)), strict=False)
        missing = [k for k in missing if not k.startswith("discriminator.")]
        if missing or unexpected:
            raise CheckpointError(f"{extra_file}: does not match this ELECTRA setup (missing {missing[:3]}, "
                                  f"unexpected {unexpected[:3]}); same --model_config and --generator_size?")


def _without_pooler(encoder: nn.Module) -> nn.Module:
    """ELECTRA has no pooler; an unused one would only be random weights in the export (and idle in DDP)."""
    if getattr(encoder, "pooler", None) is not None:
        encoder.pooler = None
    return encoder
