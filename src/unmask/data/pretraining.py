"""Pretraining data: text tokenized once into a memory-mapped cache, then packed into `[CLS] ... [SEP]` sequences.

The cache is a directory of three flat binary arrays: every token id in document order (`ids.bin`), a word-start
flag per token (`word_starts.bin`, for whole-word masking of packed sequences) and document boundaries
(`doc_offsets.bin`, int64), described by `meta.json`. They are appended to as the text is tokenized, batch by
batch, as the files are read line by line, and very long lines are cut at a space first, so building a cache holds
a bounded amount of text and tokens in memory whatever the size of the corpus or of one of its files. The cache is
keyed by a hash of the input files and the tokenizer, so a second run with the same data starts at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from unmask.data.sources import expand_paths, iter_document_lines
from unmask.errors import DataError, UsageError
from unmask.progress import progress

CACHE_VERSION = 2
_BATCH_CHARS = 1_000_000  # characters handed to the Rust tokenizer at once (it encodes a batch on all cores)
_LINE_CHARS = 100_000  # a longer line is cut at a space into pieces of about this size before it is encoded


def _cache_key(files: list[Path], tokenizer, text_field: str) -> str:
    h = hashlib.sha256(f"v{CACHE_VERSION}|{text_field}|".encode())
    h.update(tokenizer.backend.to_str().encode())
    for f in files:
        stat = f.stat()
        h.update(f"{f.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _pieces(lines: Iterable[str]) -> Iterator[str]:
    """The non-empty lines, each longer than `_LINE_CHARS` cut at a space (BERT's pre-tokenizer splits there too, so
    the tokens are the same)."""
    for line in lines:
        while len(line) > _LINE_CHARS:
            cut = line.rfind(" ", 0, _LINE_CHARS)
            cut = cut if cut > 0 else _LINE_CHARS
            if line[:cut].strip():
                yield line[:cut]
            line = line[cut:]
        if line.strip():
            yield line


def _batches(pieces: Iterable[str]) -> Iterator[list[str]]:
    batch, size = [], 0
    for piece in pieces:
        batch.append(piece)
        size += len(piece)
        if size >= _BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def document_blocks(lines: Iterable[str]) -> Iterator[list[str]]:
    """A document's lines in blocks of about `_BATCH_CHARS` characters, each line longer than `_LINE_CHARS` cut at
    a space: what is encoded at once (by the cache builder and by the streaming workers)."""
    return _batches(_pieces(lines))


def encode_block(tokenizer, block: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, word-start flags) of one block of a document's lines."""
    return _ids_and_starts(tokenizer.encode_batch(block, add_special_tokens=False))


def _encoded_blocks(tokenizer, documents: Iterable[Iterable[str]]) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(document number, token ids, word-start flags) of every block of every document, many short documents'
    blocks encoded in one call (the Rust tokenizer encodes a batch on all cores)."""
    pending, size = [], 0
    for number, lines in enumerate(documents):
        for block in document_blocks(lines):
            pending.append((number, block))
            size += sum(map(len, block))
            if size >= _BATCH_CHARS:
                yield from _encode_pending(tokenizer, pending)
                pending, size = [], 0
    yield from _encode_pending(tokenizer, pending)


def _encode_pending(tokenizer, pending: list[tuple[int, list[str]]]) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    if not pending:
        return
    encodings = tokenizer.encode_batch([line for _, block in pending for line in block], add_special_tokens=False)
    at = 0
    for number, block in pending:
        yield number, *_ids_and_starts(encodings[at : at + len(block)])
        at += len(block)


def _ids_and_starts(encodings) -> tuple[np.ndarray, np.ndarray]:
    ids = np.fromiter((i for e in encodings for i in e.ids), dtype=np.int64)
    starts = np.fromiter((flag for e in encodings for flag in _word_starts(e.word_ids)), dtype=np.uint8,
                         count=len(ids))
    return ids, starts


def _word_starts(word_ids: list[int | None]) -> Iterator[int]:
    """1 where a token opens a word (or is special), 0 where it continues the previous token's word."""
    previous = None
    for word in word_ids:
        yield int(word is None or word != previous)
        previous = word


def build_token_cache(patterns, tokenizer, cache_root: str | Path, text_field: str = "text",
                      show_progress: bool = True) -> Path:
    """Tokenize every document once; returns the cache directory (reused when files and tokenizer are unchanged)."""
    files = expand_paths(patterns)
    cache_dir = Path(cache_root) / _cache_key(files, tokenizer, text_field)
    if (cache_dir / "meta.json").exists():
        return cache_dir
    tmp = cache_dir.with_name(cache_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    with _CacheWriter(tmp, dtype) as cache:
        for path in progress(files, desc="tokenizing", unit="file", disable=not show_progress):
            current = None
            for number, block_ids, block_starts in _encoded_blocks(tokenizer, iter_document_lines([path], text_field)):
                if number != current:
                    cache.end_document()
                    current = number
                cache.write(block_ids, block_starts)
            cache.end_document()
    if cache.tokens == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DataError(f"{', '.join(map(str, files))}: no text (empty, or blank lines only); give --train_file "
                        "files that hold text")
    meta = {"files": [str(f) for f in files], "tokens": cache.tokens, "documents": cache.documents,
            "dtype": np.dtype(dtype).name}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    try:
        os.replace(tmp, cache_dir)  # atomic: a half-built cache never looks complete
    except OSError:  # another process finished the same cache first
        shutil.rmtree(tmp, ignore_errors=True)
    return cache_dir


class _CacheWriter:
    """Appends blocks of tokens, and the boundaries of their documents, to a cache directory's three files."""

    def __init__(self, directory: Path, dtype):
        self.files = [open(directory / name, "wb") for name in ("ids.bin", "word_starts.bin", "doc_offsets.bin")]
        self.dtype, self.tokens, self.documents, self.last_boundary = dtype, 0, 0, 0
        self.files[2].write(np.int64(0).tobytes())

    def write(self, ids: np.ndarray, word_starts: np.ndarray) -> None:
        self.files[0].write(ids.astype(self.dtype).tobytes())
        self.files[1].write(word_starts.tobytes())
        self.tokens += len(ids)

    def end_document(self) -> None:
        """The tokens written since the last boundary are one document (none: no document)."""
        if self.tokens > self.last_boundary:
            self.files[2].write(np.int64(self.tokens).tobytes())
            self.documents, self.last_boundary = self.documents + 1, self.tokens

    def __enter__(self) -> "_CacheWriter":
        return self

    def __exit__(self, *exc) -> None:
        for f in self.files:
            f.close()


def pack_spans(doc_offsets: np.ndarray, max_tokens: int, cross_documents: bool = False) -> np.ndarray:
    """(S, 2) [start, end) spans of at most `max_tokens` tokens.

    By default a span never crosses a document boundary (the last piece of a document may be short); with
    `cross_documents` the token stream is cut into full-length spans regardless of documents.
    """
    if cross_documents:
        starts = np.arange(0, int(doc_offsets[-1]), max_tokens)
        return np.stack([starts, np.minimum(starts + max_tokens, doc_offsets[-1])], 1)
    spans = []
    for begin, end in zip(doc_offsets[:-1], doc_offsets[1:]):
        starts = np.arange(begin, end, max_tokens)
        spans.append(np.stack([starts, np.minimum(starts + max_tokens, end)], 1))
    return np.concatenate(spans).astype(np.int64)


@dataclass
class PackedDataset:
    """Sequences `[CLS] span [SEP]` over a token cache, with the word ids whole-word masking needs."""

    ids: np.ndarray  # memory-mapped token ids
    word_starts: np.ndarray
    spans: np.ndarray  # (S, 2)
    cls_token_id: int
    sep_token_id: int

    @classmethod
    def from_cache(cls, cache_dir: Path, tokenizer, max_seq_length: int, cross_documents: bool = False):
        if max_seq_length < 3:
            raise UsageError(f"max_seq_length must leave room for [CLS] and [SEP], got {max_seq_length}")
        meta = json.loads((cache_dir / "meta.json").read_text())
        offsets = np.fromfile(cache_dir / "doc_offsets.bin", dtype=np.int64)
        ids = np.memmap(cache_dir / "ids.bin", dtype=meta["dtype"], mode="r")
        word_starts = np.memmap(cache_dir / "word_starts.bin", dtype=np.uint8, mode="r")
        return cls(ids, word_starts, pack_spans(offsets, max_seq_length - 2, cross_documents), tokenizer.cls_token_id,
                   tokenizer.sep_token_id)

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        start, end = self.spans[index]
        return packed_sequence(self.ids[start:end], self.word_starts[start:end], self.cls_token_id,
                               self.sep_token_id)

    def tokens(self) -> int:
        return int((self.spans[:, 1] - self.spans[:, 0]).sum() + 2 * len(self.spans))


def packed_sequence(ids: np.ndarray, word_starts: np.ndarray, cls_token_id: int, sep_token_id: int
                    ) -> dict[str, list[int]]:
    """`[CLS] span [SEP]` with the word ids whole-word masking needs (-1 on the special tokens)."""
    starts = word_starts.astype(np.int64)
    starts[0] = 1  # a span may open mid-word: its first piece starts a word of its own
    words = np.cumsum(starts) - 1
    return {"input_ids": [cls_token_id, *ids.astype(np.int64).tolist(), sep_token_id],
            "word_ids": [-1, *words.tolist(), -1]}
