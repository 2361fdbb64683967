"""Collators: turn a list of tokenized examples into a padded batch, masking it afresh each time (dynamic masking)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from unmask.data.masking import mlm_mask, real_token_ids, whole_word_mask
from unmask.errors import UsageError


def pad_batch(sequences: Sequence[Sequence[int]], pad_value: int, pad_to_multiple_of: int | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists into a (B, T) long tensor; returns it with the (B, T) attention mask (1 = real token)."""
    lengths = torch.tensor([len(s) for s in sequences])
    width = int(lengths.max()) if len(sequences) else 0
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    out = torch.full((len(sequences), width), pad_value, dtype=torch.long)
    for row, seq in enumerate(sequences):
        out[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    attention_mask = (torch.arange(width) < lengths[:, None]).long()
    return out, attention_mask


def _as_word_ids(word_ids: Sequence[int | None]) -> list[int]:
    return [-1 if w is None else int(w) for w in word_ids]


@dataclass
class MLMCollator:
    """Pads a batch and masks it with a new draw every call, from its own seeded generator.

    Examples are dicts with `input_ids` (list or tensor) and, for whole-word masking, `word_ids`
    (the tokenizer's `Encoding.word_ids`: None or -1 on special tokens).

    Example:
        >>> collate = MLMCollator.from_tokenizer(tok, mlm_probability=0.15, seed=0)
        >>> batch = collate([{"input_ids": e.ids, "word_ids": e.word_ids} for e in tok.encode_batch(texts)])
        >>> batch["input_ids"], batch["attention_mask"], batch["labels"]
    """

    pad_token_id: int
    mask_token_id: int
    special_token_ids: tuple[int, ...]
    vocab_size: int
    mlm_probability: float = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1
    whole_word_mask: bool = False
    pad_to_multiple_of: int | None = None
    seed: int = 0
    generator: torch.Generator = field(init=False, repr=False)

    def __post_init__(self):
        if self.pad_token_id not in self.special_token_ids:
            self.special_token_ids = (*self.special_token_ids, self.pad_token_id)  # padding is never masked
        self.generator = torch.Generator().manual_seed(self.seed)
        self._random_ids = real_token_ids(self.vocab_size, self.special_token_ids)

    @classmethod
    def from_tokenizer(cls, tokenizer, **kwargs) -> "MLMCollator":
        if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
            raise UsageError("masked-LM collation needs a tokenizer with a mask token and a pad token")
        return cls(pad_token_id=tokenizer.pad_token_id, mask_token_id=tokenizer.mask_token_id,
                   special_token_ids=tuple(tokenizer.special_token_ids), vocab_size=tokenizer.vocab_size, **kwargs)

    def _masking_kwargs(self) -> dict[str, Any]:
        return dict(mask_token_id=self.mask_token_id, special_token_ids=self.special_token_ids,
                    vocab_size=self.vocab_size, mlm_probability=self.mlm_probability,
                    mask_replace_prob=self.mask_replace_prob, random_replace_prob=self.random_replace_prob,
                    generator=self.generator, random_ids=self._random_ids)

    def __call__(self, examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        if not examples:
            raise UsageError("cannot collate an empty batch")
        input_ids, attention_mask = pad_batch([e["input_ids"] for e in examples], self.pad_token_id,
                                              self.pad_to_multiple_of)
        if self.whole_word_mask:
            if any("word_ids" not in e for e in examples):
                raise UsageError("whole-word masking needs 'word_ids' in every example (Encoding.word_ids)")
            word_ids, _ = pad_batch([_as_word_ids(e["word_ids"]) for e in examples], -1, self.pad_to_multiple_of)
            inputs, labels = whole_word_mask(input_ids, word_ids, **self._masking_kwargs())
        else:
            inputs, labels = mlm_mask(input_ids, **self._masking_kwargs())
        return {"input_ids": inputs, "attention_mask": attention_mask, "labels": labels}
