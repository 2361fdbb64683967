"""Tokenizers: train a BERT WordPiece vocabulary, load any Hugging Face tokenizer directory, save one back.

`Tokenizer` is a thin wrapper around a `tokenizers.Tokenizer` (the fast Rust backend that `transformers` uses too)
that knows its special tokens. The saved directory holds `tokenizer.json`, `tokenizer_config.json`,
`special_tokens_map.json` and, for WordPiece, `vocab.txt`, so `transformers.AutoTokenizer` loads it as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import (
    Encoding,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from tokenizers import Tokenizer as BackendTokenizer

from unmask.data.sources import iter_lines
from unmask.errors import CheckpointError, DataError, UsageError
from unmask.io import atomic_write_text

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Role -> the key transformers uses in tokenizer_config.json / special_tokens_map.json.
_ROLES = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
_ROLE_FALLBACKS = {"cls_token": "bos_token", "sep_token": "eos_token"}  # RoBERTa-style <s> ... </s>


class Tokenizer:
    """A fast tokenizer plus the ids of its special tokens.

    Example:
        >>> tok = Tokenizer.from_pretrained("path/to/model")
        >>> enc = tok.encode_batch(["the cat sat"])[0]
        >>> enc.ids, enc.word_ids
    """

    def __init__(self, backend: BackendTokenizer, special_tokens: dict[str, str], *,
                 model_max_length: int = 512, lowercase: bool | None = None):
        # Padding and truncation are ours to decide per call: a tokenizer.json that pads or truncates on its own
        # (all-MiniLM-L6-v2's truncates at 128) would silently cut user text.
        backend.no_padding()
        backend.no_truncation()
        self.backend = backend
        self.special_tokens = dict(special_tokens)
        self.model_max_length = int(model_max_length)
        self.lowercase = lowercase
        for role in _ROLES:
            token = self.special_tokens.get(role)
            token_id = backend.token_to_id(token) if token is not None else None
            if token is not None and token_id is None:
                raise DataError(f"special token {token!r} ({role}) is not in the vocabulary")
            setattr(self, f"{role}_id", token_id)
        # Every id flagged special in the backend (plus the named roles) is never masked or sampled.
        special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        special |= {getattr(self, f"{r}_id") for r in _ROLES if getattr(self, f"{r}_id") is not None}
        self.special_token_ids: tuple[int, ...] = tuple(sorted(special))

    # -- encoding -------------------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode_batch(self, texts: Sequence[str] | Sequence[tuple[str, str]] | Sequence[list[str]],
                     add_special_tokens: bool = True, is_pretokenized: bool = False) -> list[Encoding]:
        """Encode in parallel (Rust threads); each `Encoding` has `.ids`, `.word_ids`, `.offsets`, `.type_ids`.
        With `is_pretokenized`, each input is a list of words (CoNLL tokens) and `word_ids` index them."""
        return self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens,
                                         is_pretokenized=is_pretokenized)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.backend.id_to_token(int(i)) for i in ids]

    def __len__(self) -> int:
        return self.vocab_size

    # -- persistence ----------------------------------------------------------------------------------------------
    def save_pretrained(self, output_dir: str | Path) -> Path:
        """Write an HF tokenizer directory (each file atomically)."""
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(output_dir / "tokenizer.json", self.backend.to_str(pretty=True))
        config = {
            "tokenizer_class": "BertTokenizer" if self._is_wordpiece() else "PreTrainedTokenizerFast",
            "model_max_length": self.model_max_length,
            "clean_up_tokenization_spaces": False,
            **self.special_tokens,
        }
        if self.lowercase is not None:
            config["do_lower_case"] = self.lowercase
        atomic_write_text(output_dir / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
        atomic_write_text(output_dir / "special_tokens_map.json", json.dumps(self.special_tokens, indent=2) + "\n")
        if self._is_wordpiece():
            vocab = self.backend.get_vocab(with_added_tokens=True)
            tokens = sorted(vocab, key=vocab.__getitem__)
            atomic_write_text(output_dir / "vocab.txt", "\n".join(tokens) + "\n")
        return output_dir

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "Tokenizer":
        """Load an HF tokenizer directory: `tokenizer.json` (any model type) or a WordPiece `vocab.txt`."""
        path = Path(path)
        if not path.is_dir():
            raise DataError(f"{path}: tokenizer directory not found")
        config = _read_json(path / "tokenizer_config.json")
        special_map = _read_json(path / "special_tokens_map.json")
        lowercase = config.get("do_lower_case")
        if (path / "tokenizer.json").exists():
            try:
                backend = BackendTokenizer.from_file(str(path / "tokenizer.json"))
            except Exception as e:  # the Rust parser's message is useful, its exception type is not
                raise DataError(f"{path / 'tokenizer.json'}: not a valid tokenizer file ({e})") from e
        elif (path / "vocab.txt").exists():
            backend = _wordpiece_from_vocab(path / "vocab.txt", lowercase=lowercase is not False)
        else:
            raise DataError(f"{path}: no tokenizer.json or vocab.txt")
        special_tokens = {}
        for role in _ROLES:
            token = _token_name(config.get(role) or special_map.get(role))
            if token is None and role in _ROLE_FALLBACKS:
                fallback = _ROLE_FALLBACKS[role]
                token = _token_name(config.get(fallback) or special_map.get(fallback))
            if token is None and backend.token_to_id(SPECIAL_TOKENS[_ROLES.index(role)]) is not None:
                token = SPECIAL_TOKENS[_ROLES.index(role)]
            if token is not None:
                special_tokens[role] = token
        max_length = config.get("model_max_length", 512)
        if not isinstance(max_length, int) or max_length > 1_000_000:  # HF writes 1e30 for "no limit"
            max_length = 512
        return cls(backend, special_tokens, model_max_length=max_length, lowercase=lowercase)

    def _is_wordpiece(self) -> bool:
        return isinstance(self.backend.model, models.WordPiece)


def load_tokenizer(path: str | Path, config=None) -> Tokenizer:
    """The tokenizer stored in a model directory, checked against the model's vocabulary (`config.vocab_size`)."""
    tokenizer = Tokenizer.from_pretrained(path)
    if config is not None and tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model's embedding has "
                              f"{config.vocab_size} rows: they do not belong together")
    return tokenizer


def bert_wordpiece_backend(lowercase: bool = True) -> BackendTokenizer:
    """An untrained BERT WordPiece pipeline: BERT normaliser and pre-tokenizer, `[CLS] A [SEP] (B [SEP])`."""
    backend = BackendTokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                    strip_accents=None, lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    return backend


def _add_bert_post_processor(backend: BackendTokenizer) -> None:
    cls_id, sep_id = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )


def train_tokenizer(files: Sequence[str | Path], vocab_size: int = 30522, *, lowercase: bool = True,
                    min_frequency: int = 2, text_field: str = "text", model_max_length: int = 512,
                    output_dir: str | Path | None = None, show_progress: bool = True) -> Tokenizer:
    """Train a BERT WordPiece tokenizer on text / JSONL / gzip files (Gutenberg boilerplate stripped).

    Special tokens get ids 0-4 in the order `[PAD] [UNK] [CLS] [SEP] [MASK]`. The same files and arguments give the
    same vocabulary, run after run: `tokenizers`' trainer gives each word-internal piece `##c` its id in hash-map
    order and breaks ties between equally frequent merges by id, so left alone two runs differ (tokenizers #1794).
    Here every `##c` of the corpus's characters is given its id up front, in sorted order, and the trained
    vocabulary is then rebuilt with the five special tokens as the only added tokens.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise UsageError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    vocab = train_wordpiece(files, vocab_size, bert_wordpiece_backend(lowercase), min_frequency=min_frequency,
                            text_field=text_field, show_progress=show_progress)
    tokenizer = Tokenizer(_wordpiece_backend(vocab, lowercase), dict(zip(_ROLES, SPECIAL_TOKENS)),
                          model_max_length=model_max_length, lowercase=lowercase)
    if output_dir is not None:
        tokenizer.save_pretrained(output_dir)
    return tokenizer


def train_wordpiece(files: Sequence[str | Path], vocab_size: int, like: BackendTokenizer, *, min_frequency: int = 2,
                    text_field: str = "text", show_progress: bool = False) -> dict[str, int]:
    """A WordPiece vocabulary (token -> id, the special tokens first) trained on the files with the normaliser and
    pre-tokenizer of `like`; the same one run after run (see `train_tokenizer`)."""
    backend = BackendTokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    backend.normalizer, backend.pre_tokenizer = like.normalizer, like.pre_tokenizer
    pieces = _continuing_pieces(iter_lines(files, text_field), backend)
    if not pieces:
        raise DataError(f"{', '.join(map(str, files))}: no text to train a tokenizer on (empty, or blank "
                        "lines only)")
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=[*SPECIAL_TOKENS, *pieces], continuing_subword_prefix="##",
                                        show_progress=show_progress)
    backend.train_from_iterator(_batches(iter_lines(files, text_field)), trainer=trainer)
    return backend.get_vocab(with_added_tokens=True)


def _continuing_pieces(lines: Iterable[str], backend: BackendTokenizer) -> list[str]:
    """`##c` for every character c the normaliser can output on these lines, sorted."""
    raw: set[str] = set()
    for line in lines:
        raw.update(line)
    normalise = backend.normalizer.normalize_str if backend.normalizer is not None else str
    normalised = {c for r in raw for c in normalise(r) if not c.isspace()}
    return [f"##{c}" for c in sorted(normalised)]


def _batches(lines: Iterable[str], size: int = 1000) -> Iterable[list[str]]:
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _wordpiece_backend(vocab: dict[str, int], lowercase: bool) -> BackendTokenizer:
    """A BERT WordPiece tokenizer over `vocab` (token -> id); the special tokens present are its added tokens."""
    backend = bert_wordpiece_backend(lowercase)
    backend.model = models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##")
    backend.add_special_tokens([t for t in SPECIAL_TOKENS if t in vocab])
    _add_bert_post_processor(backend)
    return backend


def _wordpiece_from_vocab(vocab_file: Path, lowercase: bool) -> BackendTokenizer:
    vocab_lines = vocab_file.read_text(encoding="utf-8").split("\n")
    return _wordpiece_backend({token: i for i, token in enumerate(t for t in vocab_lines if t)}, lowercase)


def _token_name(value) -> str | None:
    if isinstance(value, dict):  # AddedToken serialised as {"content": ...}
        return value.get("content")
    return value


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not valid JSON ({e})") from e
