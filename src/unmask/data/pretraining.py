"""Pretraining data: text tokenized once into a memory-mapped cache, then packed into `[CLS] ... [SEP]` sequences.

The cache is a directory of three arrays: every token id in document order (`ids.npy`), a word-start flag per token
(`word_starts.npy`, for whole-word masking of packed sequences) and document boundaries (`doc_offsets.npy`). It is
keyed by a hash of the input files and the tokenizer, so a second run with the same data starts at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from unmask.data.sources import expand_paths, iter_documents
from unmask.errors import DataError, UsageError

CACHE_VERSION = 1
_LINES_PER_BATCH = 4096  # lines handed to the Rust tokenizer at once (it encodes a batch on all cores)


def _cache_key(files: list[Path], tokenizer, text_field: str) -> str:
    h = hashlib.sha256(f"v{CACHE_VERSION}|{text_field}|".encode())
    h.update(tokenizer.backend.to_str().encode())
    for f in files:
        stat = f.stat()
        h.update(f"{f.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _encode_document(tokenizer, document: str) -> tuple[list[int], list[int]]:
    """Token ids and word-start flags of one document, encoded line by line in parallel batches."""
    ids: list[int] = []
    starts: list[int] = []
    lines = [line for line in document.split("\n") if line.strip()]
    for i in range(0, len(lines), _LINES_PER_BATCH):
        for enc in tokenizer.encode_batch(lines[i : i + _LINES_PER_BATCH], add_special_tokens=False):
            ids.extend(enc.ids)
            previous = None
            for word in enc.word_ids:
                starts.append(int(word is None or word != previous))
                previous = word
    return ids, starts


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
    ids: list[np.ndarray] = []
    starts: list[np.ndarray] = []
    offsets = [0]
    for path in tqdm(files, desc="tokenizing", unit="file", disable=not show_progress):
        for document in iter_documents([path], text_field):
            doc_ids, doc_starts = _encode_document(tokenizer, document)
            if doc_ids:
                ids.append(np.asarray(doc_ids, dtype=np.int32))
                starts.append(np.asarray(doc_starts, dtype=np.uint8))
                offsets.append(offsets[-1] + len(doc_ids))
    if offsets[-1] == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DataError(f"no text found in {[str(f) for f in files]}")
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    np.save(tmp / "ids.npy", np.concatenate(ids).astype(dtype))
    np.save(tmp / "word_starts.npy", np.concatenate(starts))
    np.save(tmp / "doc_offsets.npy", np.asarray(offsets, dtype=np.int64))
    meta = {"files": [str(f) for f in files], "tokens": offsets[-1], "documents": len(offsets) - 1}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    try:
        os.replace(tmp, cache_dir)  # atomic: a half-built cache never looks complete
    except OSError:  # another process finished the same cache first
        shutil.rmtree(tmp, ignore_errors=True)
    return cache_dir


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
        offsets = np.load(cache_dir / "doc_offsets.npy")
        return cls(np.load(cache_dir / "ids.npy", mmap_mode="r"), np.load(cache_dir / "word_starts.npy", mmap_mode="r"),
                   pack_spans(offsets, max_seq_length - 2, cross_documents), tokenizer.cls_token_id,
                   tokenizer.sep_token_id)

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        start, end = self.spans[index]
        body = self.ids[start:end].astype(np.int64)
        starts = self.word_starts[start:end].astype(np.int64)
        starts[0] = 1  # a span may open mid-word: its first piece starts a word of its own
        words = np.cumsum(starts) - 1
        return {"input_ids": [self.cls_token_id, *body.tolist(), self.sep_token_id],
                "word_ids": [-1, *words.tolist(), -1]}

    def tokens(self) -> int:
        return int((self.spans[:, 1] - self.spans[:, 0]).sum() + 2 * len(self.spans))
