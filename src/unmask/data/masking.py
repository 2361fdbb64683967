"""Masked-language-model corruption, exactly as BERT defines it, as pure functions over batched tensors.

Each maskable position is *chosen* with probability `mlm_probability`. Of the chosen positions
`mask_replace_prob` (80%) become `[MASK]`, `random_replace_prob` (10%) become a random *real* token, and the rest
(10%) keep their token. Special tokens and padding are never chosen. Labels hold the original id at chosen positions
and -100 everywhere else, so only those positions enter the loss.

All randomness comes from the `torch.Generator` passed in: the same generator state gives the same masks.
"""

from __future__ import annotations

import torch

from unmask.errors import UsageError
from unmask.models.outputs import IGNORE_INDEX


def special_tokens_mask(input_ids: torch.Tensor, special_token_ids) -> torch.Tensor:
    """True where `input_ids` holds a special token (`[CLS]`, `[SEP]`, `[PAD]`, ...). (B, T) bool."""
    special = torch.as_tensor(list(special_token_ids), dtype=input_ids.dtype, device=input_ids.device)
    return torch.isin(input_ids, special)


def real_token_ids(vocab_size: int, special_token_ids) -> torch.Tensor:
    """The ids a random replacement may take: the whole vocabulary minus the special tokens. (V_real,) long."""
    keep = torch.ones(vocab_size, dtype=torch.bool)
    keep[[i for i in special_token_ids if 0 <= i < vocab_size]] = False
    return keep.nonzero().squeeze(1)


def _corrupt(input_ids: torch.Tensor, chosen: torch.Tensor, decision: torch.Tensor, *, mask_token_id: int,
             random_ids: torch.Tensor, mask_replace_prob: float, random_replace_prob: float,
             generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply the 80/10/10 rule to the chosen positions, given one uniform `decision` draw per position."""
    labels = torch.where(chosen, input_ids, IGNORE_INDEX)  # taken before corruption
    to_mask = chosen & (decision < mask_replace_prob)
    to_random = chosen & (decision >= mask_replace_prob) & (decision < mask_replace_prob + random_replace_prob)
    draws = torch.randint(len(random_ids), input_ids.shape, generator=generator, device=input_ids.device)
    inputs = torch.where(to_mask, mask_token_id, input_ids)
    inputs = torch.where(to_random, random_ids.to(input_ids.device)[draws], inputs)
    return inputs, labels


def _check_ratios(mlm_probability: float, mask_replace_prob: float, random_replace_prob: float) -> None:
    if not 0.0 < mlm_probability < 1.0:
        raise UsageError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
    if min(mask_replace_prob, random_replace_prob) < 0 or mask_replace_prob + random_replace_prob > 1.0 + 1e-9:
        raise UsageError("mask_replace_prob and random_replace_prob must be >= 0 and sum to at most 1, "
                         f"got {mask_replace_prob} and {random_replace_prob}")


def mlm_mask(input_ids: torch.Tensor, *, mask_token_id: int, special_token_ids, vocab_size: int,
             mlm_probability: float = 0.15, mask_replace_prob: float = 0.8, random_replace_prob: float = 0.1,
             maskable: torch.Tensor | None = None, generator: torch.Generator | None = None,
             random_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level BERT masking.

    Args:
        input_ids: (B, T) token ids, padding included.
        special_token_ids: ids that are never chosen and never sampled as replacements (padding among them).
        maskable: optional (B, T) bool overriding which positions may be chosen (default: not special).
        random_ids: optional precomputed `real_token_ids(vocab_size, special_token_ids)`.
    Returns:
        (inputs, labels), both (B, T); labels are -100 where nothing was chosen.
    """
    _check_ratios(mlm_probability, mask_replace_prob, random_replace_prob)
    if maskable is None:
        maskable = ~special_tokens_mask(input_ids, special_token_ids)
    if random_ids is None:
        random_ids = real_token_ids(vocab_size, special_token_ids)
    u = torch.rand((2, *input_ids.shape), generator=generator, device=input_ids.device)
    chosen = (u[0] < mlm_probability) & maskable
    return _corrupt(input_ids, chosen, u[1], mask_token_id=mask_token_id, random_ids=random_ids,
                    mask_replace_prob=mask_replace_prob, random_replace_prob=random_replace_prob,
                    generator=generator)


def whole_word_mask(input_ids: torch.Tensor, word_ids: torch.Tensor, *, mask_token_id: int, special_token_ids,
                    vocab_size: int, mlm_probability: float = 0.15, mask_replace_prob: float = 0.8,
                    random_replace_prob: float = 0.1, generator: torch.Generator | None = None,
                    random_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole-word masking: each *word* is chosen with `mlm_probability` and one 80/10/10 decision covers all its
    pieces (each piece of a "random" word gets its own random real token).

    Words come from the tokenizer's word ids (`Encoding.word_ids`), so WordPiece `##`, BPE `Ġ` and SentencePiece `▁`
    vocabularies all work; nothing looks at token strings.

    Args:
        word_ids: (B, T) long, the word index of each piece within its row, -1 for special tokens and padding.
    """
    _check_ratios(mlm_probability, mask_replace_prob, random_replace_prob)
    if word_ids.shape != input_ids.shape:
        raise UsageError(f"word_ids {tuple(word_ids.shape)} and input_ids {tuple(input_ids.shape)} differ in shape")
    if random_ids is None:
        random_ids = real_token_ids(vocab_size, special_token_ids)
    has_word = (word_ids >= 0) & ~special_tokens_mask(input_ids, special_token_ids)
    n_words = int(word_ids.max().item()) + 1 if word_ids.numel() else 0
    # one choice and one 80/10/10 decision per word, then gathered onto the word's pieces
    u = torch.rand((2, input_ids.shape[0], max(n_words, 1)), generator=generator, device=input_ids.device)
    index = word_ids.clamp(min=0)
    chosen = torch.gather(u[0] < mlm_probability, 1, index) & has_word
    decision = torch.gather(u[1], 1, index)
    return _corrupt(input_ids, chosen, decision, mask_token_id=mask_token_id, random_ids=random_ids,
                    mask_replace_prob=mask_replace_prob, random_replace_prob=random_replace_prob,
                    generator=generator)


def word_ids_from_starts(word_starts: torch.Tensor, maskable: torch.Tensor) -> torch.Tensor:
    """Word ids (B, T) from a word-start flag per piece (as stored in a packed token cache); -1 where not maskable.

    A piece that starts a word opens a new id; the pieces after it share that id.
    """
    ids = torch.cumsum(word_starts.long() & maskable.long(), dim=1) - 1
    return torch.where(maskable, ids.clamp(min=0), -1)


def whole_word_spans(pieces: list[str], prefix: str = "##") -> list[str]:
    """Group WordPiece pieces into words, the lesson's way: a piece starting with `##` continues the word before.

    >>> whole_word_spans(["the", "un", "##believ", "##able", "cat"])
    ['the', 'un ##believ ##able', 'cat']
    """
    spans: list[list[str]] = []
    for piece in pieces:
        if piece.startswith(prefix) and spans:
            spans[-1].append(piece)
        else:
            spans.append([piece])
    return [" ".join(span) for span in spans]
