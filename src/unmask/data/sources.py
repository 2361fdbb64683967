"""Readers for training text, with Project Gutenberg boilerplate removed:

- plain text and JSON Lines, each plain, gzip (`.gz`) or zstandard (`.zst`) compressed;
- Parquet files and Arrow files (`.parquet`, `.arrow`), and `datasets.Dataset.save_to_disk` directories (their
  `.arrow` shards), read batch by batch through `pyarrow`, one column (`--text_field`).

A *document* is the unit that packing never crosses: a whole `.txt` file, one line of a `.jsonl` file, or one row
of a Parquet or Arrow table.
"""

from __future__ import annotations

import glob
import gzip
import itertools
import json
import re
from pathlib import Path
from typing import Iterable, Iterator

from unmask.errors import DataError

# Gutenberg files wrap the book between one start and one end marker; some omit the space after "***".
_GUTENBERG_START = re.compile(r"^\*\*\* ?START OF .*$", re.MULTILINE)
_GUTENBERG_END = re.compile(r"^\*\*\* ?END OF .*$", re.MULTILINE)


_ARROW_BATCH = 1024  # rows read at once from a Parquet or Arrow file
_READ_BYTES = 1 << 20  # bytes read at once from a text file
_GUTENBERG_HEAD = 1000  # lines of a text file searched for Project Gutenberg's START marker


def expand_paths(patterns: Iterable[str | Path]) -> list[Path]:
    """Turn file names, globs and `save_to_disk` directories into an ordered, de-duplicated list of files."""
    files: list[Path] = []
    for pattern in patterns:
        pattern = str(pattern)
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise DataError(f"{pattern}: no file matches this pattern")
        for match in matches:
            path = Path(match)
            found = _saved_dataset_shards(path) if path.is_dir() else [path]
            for file in found:
                if not file.exists():
                    raise DataError(f"{file}: no such file")
                if file not in files:
                    files.append(file)
    return files


def _saved_dataset_shards(directory: Path) -> list[Path]:
    """The `.arrow` shards of a `datasets.Dataset.save_to_disk` directory, in their order (its `state.json`)."""
    state_file = directory / "state.json"
    if not state_file.exists():
        raise DataError(f"{directory}: is a directory but not a saved dataset (no state.json); pass files or a glob "
                        f"such as '{directory}/*.txt'")
    try:
        shards = [directory / entry["filename"] for entry in json.loads(state_file.read_text())["_data_files"]]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise DataError(f"{state_file}: not a datasets state file ({e})") from e
    if not shards:
        raise DataError(f"{state_file}: lists no data files")
    return shards


def strip_gutenberg(text: str) -> str:
    """Keep only the book body between Project Gutenberg's START and END markers (text without markers is kept)."""
    start = _GUTENBERG_START.search(text)
    if start is None:
        return text
    end = _GUTENBERG_END.search(text, start.end())
    return text[start.end() : end.start() if end else len(text)].strip("\n")


def read_text(path: str | Path) -> str:
    """A whole (small) file as text: gzip or zstandard undone, UTF-8 checked (a clear error naming the byte), BOM
    and CR removed. Training text is streamed instead (`iter_document_lines`)."""
    return "\n".join(_text_lines(Path(path)))


def _format(path: Path) -> str:
    """"table" (Parquet / Arrow), "jsonl" or "text", by the name without a compression suffix."""
    name = path.name.removesuffix(".gz").removesuffix(".zst")
    if name.endswith((".parquet", ".arrow")):
        return "table"
    return "jsonl" if name.endswith((".jsonl", ".json", ".ndjson")) else "text"


def _table_batches(path: Path, text_field: str) -> Iterator:
    """Record batches of the `text_field` column of a Parquet or Arrow file (IPC stream, as `datasets` writes it,
    or IPC file format)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.name.endswith(".parquet"):
        parquet = pq.ParquetFile(path)
        _check_column(path, text_field, parquet.schema_arrow.names)
        yield from parquet.iter_batches(batch_size=_ARROW_BATCH, columns=[text_field])
        return
    source = pa.memory_map(str(path))
    try:
        stream = pa.ipc.open_stream(source)
    except pa.ArrowInvalid:  # not a stream: the random-access file format
        source.seek(0)
        stream = pa.ipc.open_file(source)
        _check_column(path, text_field, stream.schema.names)
        for i in range(stream.num_record_batches):
            yield stream.get_batch(i).select([text_field])
        return
    _check_column(path, text_field, stream.schema.names)
    for batch in stream:
        yield batch.select([text_field])


def _check_column(path: Path, text_field: str, columns: list[str]) -> None:
    if text_field not in columns:
        raise DataError(f"{path}: no column {text_field!r} (columns: {', '.join(columns)}); set --text_field")


def _table_documents(path: Path, text_field: str) -> Iterator[str]:
    import pyarrow as pa

    row = 0
    try:
        for batch in _table_batches(path, text_field):
            for value in batch.column(0).to_pylist():
                row += 1
                if value is not None and not isinstance(value, str):
                    raise DataError(f"{path}: row {row}, column {text_field!r} is {type(value).__name__}, not text")
                if value and value.strip():
                    yield value
    except (OSError, pa.ArrowException) as e:
        where = f"after row {row}" if row else "at its start"
        raise DataError(f"{path}: not a readable {path.suffix[1:]} file, damaged {where} ({e})") from e


def json_objects(path: Path, lines: Iterable[str]) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank JSONL line; a line that is not a JSON object names itself."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{number}: not a JSON object ({e.msg})") from e
        if not isinstance(record, dict):
            raise DataError(f"{path}:{number}: not a JSON object but a {type(record).__name__}")
        yield number, record


def _jsonl_documents(path: Path, text_field: str) -> Iterator[str]:
    for line_number, record in json_objects(path, _text_lines(path)):
        if text_field not in record:
            raise DataError(f"{path}:{line_number}: no field {text_field!r} (found {sorted(record)}); set "
                            "--text_field")
        value = record[text_field]
        if not isinstance(value, str):
            raise DataError(f"{path}:{line_number}: field {text_field!r} is {type(value).__name__}, not text")
        yield value


def iter_documents(paths: Iterable[str | Path], text_field: str = "text") -> Iterator[str]:
    """Yield the documents of every file in order, each as one string: a `.txt` file is one document, a `.jsonl`
    line or a table row is one (`iter_document_lines` streams them instead)."""
    for lines in iter_document_lines(paths, text_field):
        text = "\n".join(lines)
        if text.strip():
            yield text


def iter_document_lines(paths: Iterable[str | Path], text_field: str = "text") -> Iterator[Iterator[str]]:
    """Every document of every file in order, as an iterator over its lines, read from disk as it is consumed: a
    book in a `.txt` file is never held whole (consume each document before asking for the next)."""
    for path in expand_paths(paths):
        kind = _format(path)
        if kind == "table":
            yield from (iter(value.split("\n")) for value in _table_documents(path, text_field))
        elif kind == "jsonl":
            yield from (iter(value.split("\n")) for value in _jsonl_documents(path, text_field))
        else:
            yield _book_lines(path)


def iter_lines(paths: Iterable[str | Path], text_field: str = "text") -> Iterator[str]:
    """Non-empty lines of every document (what a tokenizer trainer wants to see)."""
    for lines in iter_document_lines(paths, text_field):
        for line in lines:
            if line.strip():
                yield line


def _book_lines(path: Path) -> Iterator[str]:
    """The lines of a text file, without Project Gutenberg's header and licence when its first lines hold a START
    marker (as `strip_gutenberg` does for a whole text)."""
    lines = _text_lines(path)
    head = list(itertools.islice(lines, _GUTENBERG_HEAD))
    start = next((i for i, line in enumerate(head) if _GUTENBERG_START.match(line)), None)
    if start is None:
        yield from itertools.chain(head, lines)
        return
    for line in itertools.chain(head[start + 1 :], lines):
        if _GUTENBERG_END.match(line):
            return
        yield line


def _text_lines(path: Path) -> Iterator[str]:
    """A text file's lines, decoded as they are read: UTF-8 checked (a clear error naming the byte), BOM and CR
    removed."""
    for offset, raw in _raw_lines(path):
        if offset == 0 and raw.startswith(b"\xef\xbb\xbf"):
            raw, offset = raw[3:], 3
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not valid UTF-8 (byte {offset + e.start}: {raw[e.start:e.start + 1]!r}); "
                            "convert it first, e.g. iconv -f latin1 -t utf-8") from e
        yield from line.removesuffix("\r").split("\r")


def _raw_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line without its newline) of a plain, gzip or zstandard file, read a megabyte at a time."""
    offset, rest = 0, []
    try:
        with _open_binary(path) as f:
            while chunk := f.read(_READ_BYTES):
                *lines, last = chunk.split(b"\n")
                if lines:
                    lines[0] = b"".join([*rest, lines[0]])
                    rest = []
                    for line in lines:
                        yield offset, line
                        offset += len(line) + 1
                rest.append(last)
    except FileNotFoundError as e:
        raise DataError(f"{path}: no such file") from e
    except (OSError, EOFError) as e:  # a truncated or non-gzip file behind a .gz name
        raise DataError(f"{path}: cannot be read ({e})") from e
    last = b"".join(rest)
    if last:
        yield offset, last


def _open_binary(path: Path):
    if path.name.endswith(".zst"):
        import pyarrow as pa

        return pa.input_stream(str(path), compression="zstd")
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")
