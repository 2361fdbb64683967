"""BERT (Devlin et al., 2018): post-LN Transformer encoder with learned absolute positions and token types.

Parameter names are Hugging Face's, so `load_state_dict(strict=True)` works both ways with `transformers`'
`BertModel` / `BertForMaskedLM` without a conversion table (that is why `LayerNorm` is not snake-cased).
Shapes: B batch, T tokens, H hidden, nh heads, hd head dim, V vocabulary, N real (not padding) tokens.

Between the embeddings and the output, the layers see only the real tokens, concatenated as (N, H) rows: the dense
layers, nearly all of the FLOPs, skip the padding (two thirds of a randomly batched SST-2 step); attention restores
the (B, T) layout it needs (`attention.varlen`). The output is padded back to (B, T, H). With
`model.attn_backend = "sdpa"` every position is a row instead, (B T, H), and each layer makes one masked SDPA call:
transformers' layout, a graph of fixed shape (what ONNX export traces).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from unmask.config import BertConfig
from unmask.hub import HubMixin
from unmask.models import attention
from unmask.models.activations import ACTIVATIONS, activate
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
from unmask.models.padding import pad_input, unpad_input

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]  # (q, k, v, dropout_p)


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(N,) each -> (N, H)."""
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        H = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.query, self.key, self.value = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, attend: Attend) -> torch.Tensor:
        N, H = x.shape
        nh, hd = self.num_heads, H // self.num_heads
        if self.training and isinstance(self.query, nn.Linear):
            # training: one GEMM for q, k and v forward, and one per gradient backward; the weights stay three
            # HF-named parameters, stacked anew each step (they change every step)
            weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
            bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
            q, k, v = F.linear(x, weight, bias).view(N, 3, nh, hd).unbind(1)  # (N, nh, hd) each
        else:
            # inference: three GEMMs, no weight copy per call (stacking bert-base's q/k/v weights would copy them at
            # every forward, a visible share of a one-input latency); also the path of int8 packed weights, which
            # cannot be stacked
            q, k, v = (proj(x).view(N, nh, hd) for proj in (self.query, self.key, self.value))
        y = attend(q, k, v, self.dropout_p if self.training else 0.0)  # (N, nh, hd)
        return y.reshape(N, H)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(y)) + residual)  # post-LN: normalise after the residual


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, attend: Attend, rows: torch.Tensor | None = None) -> torch.Tensor:
        y = self.self(x, attend)  # (N, H): every row is a key and a value
        if rows is not None:  # only these rows' outputs are read: the rest of the layer runs on them alone
            x, y = x[rows], y[rows]  # (M, H)
        return self.output(y, x)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = config.hidden_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activate(self.activation, self.dense(x))  # (N, 4H)


class BertOutput(BertSelfOutput):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, attend: Attend, rows: torch.Tensor | None = None) -> torch.Tensor:
        x = self.attention(x, attend, rows)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, attend: Attend, last_rows: torch.Tensor | None = None) -> torch.Tensor:
        """`last_rows` (N,) bool: the rows whose output is wanted; the last layer computes only those."""
        for i, layer in enumerate(self.layer):
            x = layer(x, attend, last_rows if i == len(self.layer) - 1 else None)
        return x


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x[:, 0]))  # (B, H) from [CLS]


def init_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm, zero padding embedding."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=std)
        if module.padding_idx is not None:
            module.weight.data[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def _init_module(self, module: nn.Module) -> None:
    """Draw `module`'s weights anew by BERT's rule: `from_pretrained` calls it for a head the checkpoint lacks."""
    init_weights(module, self.config.initializer_range)


def sinusoidal_table(num_positions: int, dim: int) -> torch.Tensor:
    """(P, H) sin/cos position table of "Attention Is All You Need": row p+k is a fixed rotation of row p."""
    position = torch.arange(num_positions, dtype=torch.float32)[:, None]  # (P, 1)
    frequency = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float32) / dim)  # (H/2,)
    table = torch.zeros(num_positions, dim)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: dim // 2])
    return table


def init_positions_sinusoidal(model: nn.Module, std: float) -> None:
    """Start every BERT position embedding (still learned) from the sin/cos table, scaled to RMS `std`.

    Why: from N(0, std) noise, BERT spends its first thousands of MLM steps as a bag of words (near-uniform
    attention, loss on a plateau) until positions become usable; with the table, "attend to the next token" is
    one linear map for every position, so local attention forms early: the first layer attends to the neighbours
    thousands of steps sooner, and the validation loss gets there in well under half the steps (BENCHMARKS.md).
    """
    for module in model.modules():
        if isinstance(module, BertEmbeddings):
            weight = module.position_embeddings.weight  # (P, H)
            with torch.no_grad():
                weight.copy_(sinusoidal_table(*weight.shape) * std * math.sqrt(2))  # sin/cos have RMS 1/sqrt(2)


class BertModel(HubMixin, nn.Module):
    base_model_prefix = None  # this *is* the encoder
    config_class = BertConfig
    init_module = _init_module

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.attn_backend = "varlen"  # or "sdpa" (padded); a run-time choice that changes no parameter
        self.apply(lambda m: init_weights(m, config.initializer_range))

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, output_mask: torch.Tensor | None = None) -> EncoderOutput:
        """`output_mask` (B, T) bool: return the last hidden states at these positions only, as (M, H) rows in
        row-major order, and no pooler output. The last layer then runs its attention output and feed-forward at
        those rows alone (a sparse MLM head reads ~15% of the positions; a fill-mask one or two a text)."""
        check_inputs(self.config, input_ids)
        B, T = input_ids.shape
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if output_mask is not None:
            check_output_mask(output_mask, attention_mask)
        varlen = self.attn_backend == "varlen"
        batch = unpad_input(attention_mask) if varlen else None
        key_mask = None if varlen else attention.padded_mask(attention_mask, T, None, input_ids.device)  # (B, 1, 1, T)

        def rows(t: torch.Tensor) -> torch.Tensor:  # (B, T) -> (N,): the real tokens (varlen), or every position
            return t.flatten()[batch.indices] if varlen else t.flatten()

        flat = batch.indices if varlen else torch.arange(B * T, device=input_ids.device)  # (N,) in the (B T) batch
        # a token's position is its column, as in HF (left padding included)
        x = self.embeddings(rows(input_ids), rows(token_type_ids), flat % T)  # (N, H)

        def attend(q, k, v, dropout_p):  # (N, nh, hd) each; no token attends across sequences
            if varlen:
                return attention.varlen(q, k, v, batch, None, dropout_p)
            q, k, v = (t.view(B, T, *t.shape[1:]).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
            y = attention.sdpa(q, k, v, key_mask, dropout_p)
            return y.transpose(1, 2).flatten(0, 1)  # (B T, nh, hd)

        if output_mask is not None:
            return EncoderOutput(self.encoder(x, attend, rows(output_mask)))  # (M, H)
        x = self.encoder(x, attend)
        x = pad_input(x, batch.indices, B, T) if varlen else x.view(B, T, -1)  # (B, T, H); varlen: zeros at padding
        return EncoderOutput(x, self.pooler(x) if self.pooler is not None else None)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACTIVATIONS[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias  # one parameter under both HF names

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x))  # (..., V)


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.predictions(x)


class BertForMaskedLM(HubMixin, nn.Module):
    """BERT with its masked-LM head; the decoder shares the word-embedding matrix.

    `forward` returns (B, T, V) logits, as `transformers` does. With `sparse_prediction=True` (training, fill-mask),
    the head and the last layer's attention output and feed-forward run only at the labelled positions: the loss
    equals the one computed from full logits, without the (B, T, V) tensor, and `logits` is (M, V) in row-major order
    of `predicted_positions` (the labelled ones and a few more, label -100; without labels, every real token
    and no loss: SPLADE).
    """

    base_model_prefix = "bert"
    config_class = BertConfig
    init_module = _init_module

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.cls.apply(lambda m: init_weights(m, config.initializer_range))
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def get_input_embeddings(self) -> nn.Embedding:
        return self.bert.embeddings.word_embeddings

    def get_output_embeddings(self) -> nn.Linear:
        return self.cls.predictions.decoder

    def set_vocabulary(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        """A new word-embedding table (V', H) and decoder bias (V',): a vocabulary grown or shrunk."""
        self.bert.embeddings.word_embeddings = nn.Embedding.from_pretrained(
            weight, freeze=False, padding_idx=self.config.pad_token_id)
        self.cls.predictions.bias = nn.Parameter(bias)
        self.cls.predictions.decoder = nn.Linear(self.config.hidden_size, len(bias))
        self.cls.predictions.decoder.bias = self.cls.predictions.bias
        self.config.vocab_size = len(bias)
        self.config.tie_word_embeddings = True
        self.tie_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                sparse_prediction: bool = False) -> MaskedLMOutput:
        if not sparse_prediction:
            x = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state  # (B, T, H)
            logits = self.cls(x)  # (B, T, V)
            return MaskedLMOutput(None if labels is None else mlm_loss(logits, labels), logits)
        if labels is None:  # every real token, no loss: SPLADE's pooling reads them all
            rows = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        else:
            rows = prediction_rows(labels, attention_mask)  # (B, T): the labelled positions, and a few to round M
        x = self.bert(input_ids, attention_mask, token_type_ids, output_mask=rows).last_hidden_state  # (M, H)
        logits = self.cls(x)  # (M, V): the vocabulary projection only where a label is
        return MaskedLMOutput(None if labels is None else mlm_loss(logits, labels[rows]), logits, rows)


class _BertClassifier(HubMixin, nn.Module):
    """BERT plus dropout and a linear classifier, HF-named; the subclasses choose what the classifier reads."""

    base_model_prefix = "bert"
    config_class = BertConfig
    init_module = _init_module
    pooled = True  # the sequence head reads the pooler; the token head has none (as in HF)

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=self.pooled)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        init_weights(self.classifier, config.initializer_range)


class BertForSequenceClassification(_BertClassifier):
    """A linear head on the pooled `[CLS]` vector: classification, or regression when `num_labels == 1`."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ClassifierOutput:
        pooled = self.bert(input_ids, attention_mask, token_type_ids).pooler_output  # (B, H)
        logits = self.classifier(self.dropout(pooled))  # (B, num_labels)
        loss = None if labels is None else classification_loss(logits, labels, self.config.num_labels)
        return ClassifierOutput(loss, logits)


class BertForTokenClassification(_BertClassifier):
    """A linear head on every token (tagging); labels are -100 where a token is not scored."""

    pooled = False

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ClassifierOutput:
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state  # (B, T, H)
        logits = self.classifier(self.dropout(hidden))  # (B, T, num_labels)
        loss = None if labels is None else classification_loss(logits, labels, self.config.num_labels)
        return ClassifierOutput(loss, logits)
