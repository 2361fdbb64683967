"""ModernBERT (Warner et al., 2024): a pre-norm encoder with rotary positions, GeGLU feed-forward, no biases, and
attention that alternates between global layers and 128-token sliding windows, for contexts up to 8,192 tokens.

Parameter names are Hugging Face's (`Wqkv`, `Wo`, `Wi`, `attn_norm`, `mlp_norm`, `final_norm`, ...), so
`load_state_dict(strict=True)` works both ways with `transformers`' ModernBert classes.

The attention backend is a run-time choice, `model.attn_backend = "varlen" | "sdpa"`, that never changes a
parameter: "varlen" (the default) drops the padding once after the embeddings and runs every layer on the
concatenated real tokens (FlashAttention's varlen kernel on a GPU where installed, an equivalent SDPA path
elsewhere); "sdpa" runs padded batches with a boolean mask (padding, plus the band on sliding-window layers), as
`transformers` does. On ragged batches varlen skips the padding's share of every product (BENCHMARKS.md); on packed
batches, with nothing to skip, the two run the same kernels.
Shapes: B batch, T tokens, N real tokens, H hidden, nh heads, hd head dim.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from unmask.config import ModernBertConfig
from unmask.errors import UsageError
from unmask.hub import HubMixin
from unmask.models import attention, rope
from unmask.models.activations import ACTIVATIONS, gated
from unmask.models.dropout import Dropout
from unmask.models.outputs import (
    ClassifierOutput,
    EncoderOutput,
    MaskedLMOutput,
    check_inputs,
    check_output_mask,
    classification_loss,
    mlm_loss,
    prediction_rows,
)
from unmask.models.padding import pad_input, positions_in_sequence, unpad_input

# attend(q, k, v, is_global) on token-major tensors (..., nh, hd) -> (..., nh, hd)
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]


def layer_norm(config: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class ModernBertEmbeddings(nn.Module):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = layer_norm(config)  # positions come from RoPE inside attention, not from here
        self.drop = Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.tok_embeddings(input_ids)))


class ModernBertAttention(nn.Module):
    def __init__(self, config: ModernBertConfig, layer_id: int):
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.is_global = config.layer_types[layer_id] == "full_attention"
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.out_drop = Dropout(config.attention_dropout)

    def forward(self, x: torch.Tensor, cos_sin: dict[bool, tuple], attend: Attend) -> torch.Tensor:
        qkv = self.Wqkv(x).view(*x.shape[:-1], 3, self.num_heads, self.head_dim)  # (..., 3, nh, hd)
        q, k, v = qkv.unbind(-3)  # each (..., nh, hd)
        cos, sin = cos_sin[self.is_global]  # global and local layers rotate with different thetas
        q, k = rope.apply_rope(q, cos, sin), rope.apply_rope(k, cos, sin)
        y = attend(q, k, v, self.is_global)  # (..., nh, hd)
        return self.out_drop(self.Wo(y.reshape(x.shape)))


class ModernBertMLP(nn.Module):
    """GeGLU: one projection gives the value and the gate, GELU(value) * gate goes back down."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.activation = config.hidden_activation
        self.drop = Dropout(config.mlp_dropout)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.Wi(x).chunk(2, dim=-1)  # (N, I) views of one (N, 2I) tensor
        return self.Wo(self.drop(gated(self.activation, value, gate)))  # Wo reads a strided half when in place


class ModernBertEncoderLayer(nn.Module):
    def __init__(self, config: ModernBertConfig, layer_id: int):
        super().__init__()
        # the embeddings end in a LayerNorm already, so the first layer skips its own (an Identity keeps names)
        self.attn_norm = nn.Identity() if layer_id == 0 else layer_norm(config)
        self.attn = ModernBertAttention(config, layer_id)
        self.mlp_norm = layer_norm(config)
        self.mlp = ModernBertMLP(config)

    def forward(self, x: torch.Tensor, cos_sin: dict, attend: Attend, rows: torch.Tensor | None = None) -> torch.Tensor:
        h = self.attn(self.attn_norm(x), cos_sin, attend)  # every row is a key and a value
        if rows is not None:  # only these rows' outputs are read: the feed-forward runs on them alone
            x, h = x[rows], h[rows]  # (M, H)
        x = x + h  # pre-norm residual blocks
        return x + self.mlp(self.mlp_norm(x))


def init_weights(module: nn.Module, config: ModernBertConfig) -> None:
    """Truncated-normal weights (cut at +-2 sigma), zero biases; output projections scaled by depth, as HF."""
    std_in = config.initializer_range
    std_out = config.initializer_range / (2.0 * config.num_hidden_layers) ** 0.5

    def trunc(linear_or_embedding: nn.Module, std: float) -> None:
        cutoff = config.initializer_cutoff_factor * std
        nn.init.trunc_normal_(linear_or_embedding.weight, std=std, a=-cutoff, b=cutoff)
        if getattr(linear_or_embedding, "bias", None) is not None:
            nn.init.zeros_(linear_or_embedding.bias)

    if isinstance(module, ModernBertEmbeddings):
        trunc(module.tok_embeddings, std_in)
    elif isinstance(module, (ModernBertAttention, ModernBertMLP)):
        trunc(module.Wqkv if isinstance(module, ModernBertAttention) else module.Wi, std_in)
        trunc(module.Wo, std_out)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


class ModernBertModel(HubMixin, nn.Module):
    base_model_prefix = None  # this *is* the encoder
    config_class = ModernBertConfig

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = layer_norm(config)
        # derived, never saved
        self.register_buffer("global_inv_freq", rope.inv_freq(config.head_dim, config.global_rope_theta),
                             persistent=False)
        self.register_buffer("local_inv_freq", rope.inv_freq(config.head_dim, config.local_rope_theta),
                             persistent=False)
        self.attn_backend = "varlen"
        self.apply(lambda m: init_weights(m, config))

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.tok_embeddings

    def _dropout(self) -> float:
        return self.config.attention_dropout if self.training else 0.0

    def _cos_sin(self, positions: torch.Tensor) -> dict[bool, tuple[torch.Tensor, torch.Tensor]]:
        """{is_global: (cos, sin)} shaped (tokens..., 1, hd) to broadcast over heads."""
        tables = {}
        for is_global, freq in ((True, self.global_inv_freq), (False, self.local_inv_freq)):
            cos, sin = rope.cos_sin(positions, freq)
            tables[is_global] = (cos.unsqueeze(-2), sin.unsqueeze(-2))
        return tables

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, output_mask: torch.Tensor | None = None) -> EncoderOutput:
        """`token_type_ids` is accepted and ignored: ModernBERT has no segment embeddings. `output_mask` (B, T)
        bool: return the last hidden states at these positions only, (M, H) in row-major order; the last layer's
        feed-forward then runs at those rows alone (what a sparse MLM head reads)."""
        check_inputs(self.config, input_ids)
        if self.attn_backend not in attention.BACKENDS:
            raise UsageError(f"attn_backend must be one of {attention.BACKENDS}, got {self.attn_backend!r}")
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        window = self.config.local_attention
        if self.attn_backend == "varlen":
            batch = unpad_input(attention_mask)
            indices = batch.indices  # (N,)
            x = self.embeddings(input_ids.flatten()[indices])  # (N, H): padding is gone from here on
            cos_sin = self._cos_sin(positions_in_sequence(batch.cu_seqlens))

            def attend(q, k, v, is_global):  # (N, nh, hd)
                return attention.varlen(q, k, v, batch, None if is_global else window, self._dropout())
        else:
            x = self.embeddings(input_ids)  # (B, T, H)
            cos_sin = self._cos_sin(torch.arange(T, device=input_ids.device))
            key_mask = None if bool(attention_mask.all()) else attention_mask  # read once, not in every layer

            def attend(q, k, v, is_global):  # (B, T, nh, hd) <-> SDPA's (B, nh, T, hd)
                y = attention.local_or_global(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              None if is_global else window, key_mask, self._dropout())
                return y.transpose(1, 2)
        rows = None
        if output_mask is not None:
            check_output_mask(output_mask, attention_mask)
            rows = output_mask.flatten()[indices] if self.attn_backend == "varlen" else output_mask  # (N,) / (B, T)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos_sin, attend, rows if i == len(self.layers) - 1 else None)
        x = self.final_norm(x)
        if rows is not None:
            return EncoderOutput(x)  # (M, H)
        if self.attn_backend == "varlen":
            x = pad_input(x, indices, B, T)  # (B, T, H), zeros at padding
        return EncoderOutput(x)


class ModernBertPredictionHead(nn.Module):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = ACTIVATIONS[config.classifier_activation]
        self.norm = layer_norm(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class _WithEncoder(HubMixin, nn.Module):
    """The encoder under HF's attribute name `model`, and the backend switch passed through to it."""

    base_model_prefix = "model"
    config_class = ModernBertConfig

    @property
    def attn_backend(self) -> str:
        return self.model.attn_backend

    @attn_backend.setter
    def attn_backend(self, value: str) -> None:
        self.model.attn_backend = value


class ModernBertForMaskedLM(_WithEncoder):
    """The MLM head: (B, T, V) logits, as `transformers`; with `sparse_prediction=True` it, and the last layer's
    feed-forward, run only at the labelled positions, (M, V) logits at `predicted_positions` (see BertForMaskedLM)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        std_out = config.initializer_range / (2.0 * config.num_hidden_layers) ** 0.5
        for linear in (self.head.dense, self.decoder):
            nn.init.trunc_normal_(linear.weight, std=std_out, a=-2 * std_out, b=2 * std_out)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.decoder.weight = self.model.embeddings.tok_embeddings.weight

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embeddings.tok_embeddings

    def get_output_embeddings(self) -> nn.Linear:
        return self.decoder

    def set_vocabulary(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        """A new word-embedding table (V', H) and decoder bias (V',): a vocabulary grown or shrunk."""
        self.model.embeddings.tok_embeddings = nn.Embedding.from_pretrained(
            weight, freeze=False, padding_idx=self.config.pad_token_id)
        self.decoder = nn.Linear(self.config.hidden_size, len(bias), bias=self.config.decoder_bias)
        if self.config.decoder_bias:
            self.decoder.bias = nn.Parameter(bias)
        self.config.vocab_size = len(bias)
        self.config.tie_word_embeddings = True
        self.tie_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                sparse_prediction: bool = False) -> MaskedLMOutput:
        if not sparse_prediction:
            x = self.model(input_ids, attention_mask).last_hidden_state  # (B, T, H)
            logits = self.decoder(self.head(x))  # (B, T, V)
            return MaskedLMOutput(None if labels is None else mlm_loss(logits, labels), logits)
        if labels is None:  # every real token, no loss: SPLADE's pooling reads them all
            rows = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        else:
            rows = prediction_rows(labels, attention_mask)  # (B, T): the labelled positions, and a few to round M
        x = self.model(input_ids, attention_mask, output_mask=rows).last_hidden_state  # (M, H)
        logits = self.decoder(self.head(x))  # (M, V)
        return MaskedLMOutput(None if labels is None else mlm_loss(logits, labels[rows]), logits, rows)


class _Classifier(_WithEncoder):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.drop = Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        std = config.hidden_size ** -0.5
        nn.init.trunc_normal_(self.classifier.weight, std=std, a=-2 * std, b=2 * std)
        nn.init.zeros_(self.classifier.bias)


class ModernBertForSequenceClassification(_Classifier):
    """The head on `[CLS]` or on the mean of the real tokens (`classifier_pooling`)."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ClassifierOutput:
        x = self.model(input_ids, attention_mask).last_hidden_state  # (B, T, H)
        if self.config.classifier_pooling == "cls":
            pooled = x[:, 0]
        else:
            mask = (attention_mask if attention_mask is not None else torch.ones_like(input_ids)).unsqueeze(-1)
            pooled = (x * mask).sum(1) / mask.sum(1)
        logits = self.classifier(self.drop(self.head(pooled)))  # (B, num_labels)
        loss = None if labels is None else classification_loss(logits, labels, self.config.num_labels)
        return ClassifierOutput(loss, logits)


class ModernBertForTokenClassification(_Classifier):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ClassifierOutput:
        x = self.model(input_ids, attention_mask).last_hidden_state  # (B, T, H)
        logits = self.classifier(self.drop(self.head(x)))  # (B, T, num_labels)
        loss = None if labels is None else classification_loss(logits, labels, self.config.num_labels)
        return ClassifierOutput(loss, logits)
