"""`--extend_vocab N`: add to a checkpoint's WordPiece vocabulary the pieces a domain corpus needs.

A WordPiece vocabulary is trained on the corpus with the checkpoint tokenizer's own normaliser and pre-tokenizer;
of its pieces that the checkpoint lacks, the N it uses most often on the corpus are appended after the existing ids,
so every old piece keeps its id and its embedding. Each new row starts as the mean of the embeddings (and decoder
biases) of the pieces the old tokenizer splits the new piece into, the table is padded to a multiple of 64 rows
with the mean of all old rows, and the decoder stays tied to it. The extended tokenizer is the old one with a
longer vocabulary, so `transformers.AutoTokenizer` reads it as it read the old one.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter

import torch
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models as tokenizer_models

from unmask.data.sources import iter_lines
from unmask.errors import UsageError
from unmask.tokenizer import SPECIAL_TOKENS, Tokenizer, train_wordpiece

ROW_MULTIPLE = 64  # embedding rows a multiple of this: matrix products run on whole tiles
SAMPLE_LINES = 200_000  # lines of the corpus on which the candidate pieces' uses are counted


def new_pieces(tokenizer: Tokenizer, files: list[str], count: int, text_field: str = "text") -> list[str]:
    """Up to `count` pieces that `tokenizer` lacks, the ones a WordPiece vocabulary trained on `files` uses most
    often on them (counted over the first `SAMPLE_LINES` lines): a piece that only served the trainer as a step
    towards longer ones, or that the corpus seldom needs, comes last."""
    old = tokenizer.backend.get_vocab()
    trained = train_wordpiece(files, len(old) + count, tokenizer.backend, text_field=text_field)
    domain = BackendTokenizer(tokenizer_models.WordPiece(trained, unk_token="[UNK]", continuing_subword_prefix="##"))
    domain.normalizer, domain.pre_tokenizer = tokenizer.backend.normalizer, tokenizer.backend.pre_tokenizer
    uses = Counter()
    lines = itertools.islice(iter_lines(files, text_field), SAMPLE_LINES)
    while batch := list(itertools.islice(lines, 4096)):
        for encoding in domain.encode_batch(batch, add_special_tokens=False):
            uses.update(encoding.tokens)
    missing = [p for p in trained if p not in old and p not in SPECIAL_TOKENS and uses[p] > 0]
    return sorted(missing, key=lambda p: (-uses[p], trained[p]))[:count]


def extended_tokenizer(tokenizer: Tokenizer, pieces: list[str]) -> Tokenizer:
    """The same tokenizer with `pieces` appended to its vocabulary (ids after the existing ones)."""
    data = json.loads(tokenizer.backend.to_str())
    vocab = data["model"]["vocab"]
    first = max(vocab.values()) + 1
    vocab.update({piece: first + i for i, piece in enumerate(pieces)})
    return Tokenizer(BackendTokenizer.from_str(json.dumps(data)), tokenizer.special_tokens,
                     model_max_length=tokenizer.model_max_length, lowercase=tokenizer.lowercase)


def old_pieces_of(tokenizer: Tokenizer, piece: str) -> list[int]:
    """The ids the old tokenizer gives `piece`: a word-internal `##x` as word-internal pieces."""
    inner = piece.startswith("##")
    ids = [token.id for token in tokenizer.backend.model.tokenize(piece[2:] if inner else piece)]
    if inner and ids:  # the first piece was read as word-initial: take its ##-form where the vocabulary has one
        first = tokenizer.backend.token_to_id("##" + tokenizer.backend.id_to_token(ids[0]))
        ids[0] = first if first is not None else ids[0]
    return [i for i in ids if i != tokenizer.unk_token_id] or ids


def extend_vocabulary(model: torch.nn.Module, tokenizer: Tokenizer, files: list[str], count: int,
                      text_field: str = "text") -> tuple[Tokenizer, list[str]]:
    """Grow a masked-LM model's vocabulary by up to `count` pieces of the corpus; returns the extended tokenizer and
    the pieces added. The model's table and decoder grow in place."""
    if not isinstance(tokenizer.backend.model, tokenizer_models.WordPiece):
        raise UsageError(f"--extend_vocab extends WordPiece vocabularies (BERT's); this tokenizer is "
                         f"{type(tokenizer.backend.model).__name__}")
    if count < 1:
        raise UsageError(f"--extend_vocab must be at least 1, got {count}")
    pieces = new_pieces(tokenizer, files, count, text_field)
    if not pieces:
        return tokenizer, []
    weight = model.get_input_embeddings().weight.detach()  # (V, H)
    decoder = model.get_output_embeddings()
    bias = decoder.bias.detach() if decoder.bias is not None else weight.new_zeros(len(weight))  # (V,)
    first = len(tokenizer.backend.get_vocab())
    rows = max(weight.shape[0], math.ceil((first + len(pieces)) / ROW_MULTIPLE) * ROW_MULTIPLE)
    new_weight = weight.mean(0).repeat(rows, 1)  # (V', H): padding rows at the mean
    new_bias = bias.mean().repeat(rows)
    new_weight[: weight.shape[0]], new_bias[: weight.shape[0]] = weight, bias
    for i, piece in enumerate(pieces):
        parts = old_pieces_of(tokenizer, piece)
        new_weight[first + i] = weight[parts].mean(0)
        new_bias[first + i] = bias[parts].mean()
    model.set_vocabulary(new_weight, new_bias)
    return extended_tokenizer(tokenizer, pieces), pieces
