"""Streamed pretraining data (`--streaming`): documents read, tokenized and packed while the model trains, in a
bounded amount of memory whatever the size of the corpus.

A rank's stream is a sequence of *units*: blocks of about a megabyte of one document's lines (the blocks the cache
builder encodes), in the epoch's file order (the files shuffled by the seed and the epoch). Document k of the file at
place f belongs to rank (f + k) % world_size, so ranks read disjoint documents. The worker processes of a `torch`
DataLoader each tokenize every W-th unit, and the loader hands their results back in unit order, so the stream is
the same for any number of workers (0 tokenizes in the training process). The training process packs the units
into `[CLS] span [SEP]` sequences cut where `pack_spans` cuts the token cache, and draws them at random from a
shuffle buffer. At an epoch's end the buffer is drawn empty before the next epoch is read, so epochs never mix and a
corpus smaller than the buffer is reopened once per epoch, not once per sequence.

Its position (`state_dict`, saved in every checkpoint) is the epoch, the last unit taken, the tokens of the current
document not packed yet, the shuffle buffer and its random state: a resumed run draws the same sequences as an
uninterrupted one. Resuming workers skip the files before the position without opening them.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from unmask.data.pretraining import document_blocks, encode_block, packed_sequence
from unmask.data.sources import expand_paths, iter_document_lines
from unmask.errors import DataError

_PREFETCH = 4  # units each worker may have tokenized ahead of training


@dataclass(frozen=True, order=True)
class Position:
    """Where a unit is: the file's place in the epoch's order, the document's number in that file, the block's
    number in that document."""

    file: int
    document: int
    block: int


@dataclass
class Unit:
    where: Position
    ids: np.ndarray  # (N,) token ids of the block
    word_starts: np.ndarray  # (N,) 1 where a token opens a word
    error: str | None = None  # the file could not be read from here on: the rest of it is dropped


def file_order(n_files: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n_files)


def _as_is(unit: Unit) -> Unit:
    return unit


class _Units(IterableDataset):
    """One rank's units of one epoch after a position; in a DataLoader worker, only every W-th is tokenized."""

    def __init__(self, stream: "TokenStream", epoch: int, after: Position | None):
        self.files, self.tokenizer, self.text_field = stream.files, stream.tokenizer, stream.text_field
        self.rank, self.world_size = stream.rank, stream.world_size
        self.order = file_order(len(stream.files), stream.seed, epoch)
        self.after = after

    def __iter__(self) -> Iterator[Unit]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        empty = np.zeros(0, dtype=np.int64)
        for n, (where, block, error) in enumerate(self._blocks()):
            if n % workers != worker:
                continue
            if error is not None:
                yield Unit(where, empty, empty.astype(np.uint8), error)
            else:
                yield Unit(where, *encode_block(self.tokenizer, block))

    def _blocks(self) -> Iterator[tuple[Position, list[str] | None, str | None]]:
        """(position, lines, error) of this rank's blocks after `self.after`: read, not tokenized."""
        first = self.after.file if self.after else 0
        for place in range(first, len(self.order)):
            for where, block, error in self._file_blocks(place, self.files[self.order[place]]):
                if self.after is None or where > self.after:
                    yield where, block, error

    def _file_blocks(self, place: int, path: Path) -> Iterator[tuple[Position, list[str] | None, str | None]]:
        document = block = 0
        try:
            for lines in iter_document_lines([path], self.text_field):
                if (place + document) % self.world_size == self.rank:  # another rank's text is never read here
                    for lines_block in document_blocks(lines):
                        yield Position(place, document, block), lines_block, None
                        block += 1
                document, block = document + 1, 0
        except DataError as e:  # every worker of the rank meets it at the same place
            yield Position(place, document, block), None, str(e)


class TokenStream:
    """This rank's endless stream of packed sequences (see the module doc): `take(n)` gives the next n."""

    def __init__(self, patterns, tokenizer, max_seq_length: int, *, text_field: str = "text",
                 cross_documents: bool = False, rank: int = 0, world_size: int = 1, seed: int = 0, workers: int = 1,
                 buffer_size: int = 10_000, skip_bad_files: bool = False, show: bool = True):
        if max_seq_length < 3:
            raise DataError(f"max_seq_length must leave room for [CLS] and [SEP], got {max_seq_length}")
        self.files = expand_paths(patterns)
        self.tokenizer, self.text_field, self.cross_documents = tokenizer, text_field, cross_documents
        self.max_tokens, self.rank, self.world_size, self.seed = max_seq_length - 2, rank, world_size, seed
        self.workers, self.buffer_size = workers, max(1, buffer_size)
        self.skip_bad_files, self.show = skip_bad_files, show
        self.epoch, self.after, self.document = 0, None, None
        self.draining = False  # an epoch ended before the buffer filled: draw it empty before reading the next
        self.carry = (np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.uint8))  # the current document's tail
        self.buffer: list[tuple[np.ndarray, np.ndarray]] = []  # packed (ids, word starts) waiting to be drawn
        self.generator = torch.Generator().manual_seed(seed * 1_000_003 + rank)
        self.skipped: list[str] = []
        self._units: Iterator[Unit] | None = None
        self._whole_epoch = self._epoch_tokens = 0

    def take(self, count: int) -> list[dict[str, list[int]]]:
        return [self._next() for _ in range(count)]

    def _next(self) -> dict[str, list[int]]:
        self.draining = self.draining and bool(self.buffer)
        while not self.draining and len(self.buffer) < self.buffer_size:
            self.draining = not self._pull() and bool(self.buffer)
        pick = int(torch.randint(len(self.buffer), (1,), generator=self.generator))
        self.buffer[pick], self.buffer[-1] = self.buffer[-1], self.buffer[pick]
        ids, starts = self.buffer.pop()
        return packed_sequence(ids, starts, self.tokenizer.cls_token_id, self.tokenizer.sep_token_id)

    def _pull(self) -> bool:
        """Pack the next unit into the buffer; False at the end of an epoch."""
        if self._units is None:
            self._whole_epoch, self._epoch_tokens = self.after is None, 0
            # the loader's own generator: drawing its worker seeds from torch's would move the training's dropout
            # draws by when (re)opening the stream happens
            self._units = iter(DataLoader(_Units(self, self.epoch, self.after), batch_size=None,
                                          collate_fn=_as_is, num_workers=self.workers,
                                          prefetch_factor=_PREFETCH if self.workers else None,
                                          generator=torch.Generator().manual_seed(self.seed)))
        unit = next(self._units, None)
        if unit is None:
            self._end_epoch()
            return False
        self.after = unit.where
        if unit.error is not None:
            self._skip_file(unit.error)
            return True
        if (unit.where.file, unit.where.document) != self.document and not self.cross_documents:
            self._pack_tail()
        self.document = (unit.where.file, unit.where.document)
        self._epoch_tokens += len(unit.ids)
        ids = np.concatenate([self.carry[0], unit.ids.astype(np.int32)])
        starts = np.concatenate([self.carry[1], unit.word_starts])
        full = len(ids) - len(ids) % self.max_tokens
        for begin in range(0, full, self.max_tokens):  # copies: a span never keeps its whole block alive
            self.buffer.append((ids[begin : begin + self.max_tokens].copy(),
                                starts[begin : begin + self.max_tokens].copy()))
        self.carry = (ids[full:].copy(), starts[full:].copy())
        return True

    def _pack_tail(self) -> None:
        """The last, short span of a document (of the whole stream with cross_documents), as `pack_spans` cuts it."""
        if len(self.carry[0]):
            self.buffer.append(self.carry)
        self.carry = (np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.uint8))

    def _end_epoch(self) -> None:
        if self._whole_epoch and not self._epoch_tokens:
            shown = ", ".join(str(f) for f in self.files[:3]) + (" ..." if len(self.files) > 3 else "")
            why = f"; {len(self.skipped)} files could not be read" if self.skipped else ""
            raise DataError(f"no text to stream for process {self.rank} of {self.world_size} in {shown}{why}")
        self._pack_tail()
        self.epoch, self.after, self.document, self._units = self.epoch + 1, None, None, None

    def _skip_file(self, error: str) -> None:
        if not self.skip_bad_files:
            raise DataError(f"{error}; --skip_bad_files drops the rest of a file that cannot be read and goes on")
        self.skipped.append(error)
        if self.show:
            print(f"streaming: skipped the rest of a file ({len(self.skipped)} so far): {error}", file=sys.stderr,
                  flush=True)

    def close(self) -> None:
        self._units = None  # the loader's workers end with its iterator

    # -- position ----------------------------------------------------------------------------------------------

    def files_key(self) -> str:
        h = hashlib.sha256()
        for f in self.files:
            h.update(f"{f.resolve()}|{f.stat().st_size}\n".encode())
        return h.hexdigest()[:16]

    def state_dict(self) -> dict:
        """Where the stream is, as tensors, numbers and strings (a checkpoint loads it with weights_only)."""
        lengths = [len(ids) for ids, _ in self.buffer]
        joined = [np.concatenate([part[i] for part in self.buffer]) if self.buffer else np.zeros(0) for i in (0, 1)]
        return {"files": self.files_key(), "epoch": self.epoch,
                "after": list(astuple(self.after)) if self.after else None,
                "document": list(self.document) if self.document else None,
                "carry_ids": torch.from_numpy(self.carry[0].astype(np.int64)),
                "carry_starts": torch.from_numpy(self.carry[1].astype(np.int64)),
                "buffer_ids": torch.from_numpy(joined[0].astype(np.int64)),
                "buffer_starts": torch.from_numpy(joined[1].astype(np.int64)),
                "buffer_lengths": torch.tensor(lengths, dtype=torch.int64),
                "generator": self.generator.get_state(), "skipped": list(self.skipped), "draining": self.draining}

    def load_state_dict(self, state: dict) -> None:
        if state["files"] != self.files_key():
            raise DataError("the training files are not those the checkpoint's run streamed (names or sizes differ): "
                            "resume with the same --train_file")
        self.epoch = state["epoch"]
        self.after = Position(*state["after"]) if state["after"] else None
        self.document = tuple(state["document"]) if state["document"] else None
        self.carry = (state["carry_ids"].numpy().astype(np.int32), state["carry_starts"].numpy().astype(np.uint8))
        ids = np.split(state["buffer_ids"].numpy().astype(np.int32), np.cumsum(state["buffer_lengths"].numpy())[:-1])
        starts = np.split(state["buffer_starts"].numpy().astype(np.uint8),
                          np.cumsum(state["buffer_lengths"].numpy())[:-1])
        self.buffer = list(zip(ids, starts)) if len(state["buffer_lengths"]) else []
        self.generator.set_state(state["generator"])
        self.skipped = list(state["skipped"])
        self.draining = state.get("draining", False)  # absent from the checkpoints of earlier versions
        self._units = None
