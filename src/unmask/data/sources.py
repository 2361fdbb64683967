"""Readers for training text: plain text, JSON Lines and gzip of either, with Project Gutenberg boilerplate removed.

A *document* is the unit that packing never crosses: a whole `.txt` file, or one line of a `.jsonl` file.
"""

from __future__ import annotations

import glob
import gzip
import json
import re
from pathlib import Path
from typing import Iterable, Iterator

from unmask.errors import DataError

# Gutenberg files wrap the book between one start and one end marker; some omit the space after "***".
_GUTENBERG_START = re.compile(r"^\*\*\* ?START OF .*$", re.MULTILINE)
_GUTENBERG_END = re.compile(r"^\*\*\* ?END OF .*$", re.MULTILINE)


def expand_paths(patterns: Iterable[str | Path]) -> list[Path]:
    """Turn file names and globs into an ordered, de-duplicated list of existing files."""
    files: list[Path] = []
    for pattern in patterns:
        pattern = str(pattern)
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise DataError(f"{pattern}: no file matches this pattern")
        for match in matches:
            path = Path(match)
            if path.is_dir():
                raise DataError(f"{path}: is a directory; pass files or a glob such as '{path}/*.txt'")
            if not path.exists():
                raise DataError(f"{path}: no such file")
            if path not in files:
                files.append(path)
    return files


def strip_gutenberg(text: str) -> str:
    """Keep only the book body between Project Gutenberg's START and END markers (text without markers is kept)."""
    start = _GUTENBERG_START.search(text)
    if start is None:
        return text
    end = _GUTENBERG_END.search(text, start.end())
    return text[start.end() : end.start() if end else len(text)].strip("\n")


def read_text(path: str | Path) -> str:
    """A whole file as text: gzip undone, UTF-8 checked (a clear error naming the byte), BOM and CR removed."""
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:  # a truncated or non-gzip file behind a .gz name
        raise DataError(f"{path}: cannot be read ({e})") from e
    try:
        # utf-8-sig drops the byte-order mark some Gutenberg files start with
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path}: not valid UTF-8 (byte {e.start}: {raw[e.start:e.start + 1]!r}); convert it first, "
            f"e.g. iconv -f latin1 -t utf-8"
        ) from e
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _is_jsonl(path: Path) -> bool:
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    return name.endswith((".jsonl", ".json", ".ndjson"))


def _jsonl_documents(path: Path, text: str, text_field: str) -> Iterator[str]:
    for line_number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{line_number}: not a JSON object ({e.msg})") from e
        if not isinstance(record, dict) or text_field not in record:
            found = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise DataError(f"{path}:{line_number}: no field {text_field!r} (found {found}); set --text_field")
        value = record[text_field]
        if not isinstance(value, str):
            raise DataError(f"{path}:{line_number}: field {text_field!r} is {type(value).__name__}, not text")
        yield value


def iter_documents(paths: Iterable[str | Path], text_field: str = "text") -> Iterator[str]:
    """Yield the documents of every file in order: a `.txt` file is one document, a `.jsonl` line is one."""
    for path in expand_paths(paths):
        text = read_text(path)
        if _is_jsonl(path):
            yield from _jsonl_documents(path, text, text_field)
        else:
            body = strip_gutenberg(text)
            if body.strip():
                yield body


def iter_lines(paths: Iterable[str | Path], text_field: str = "text") -> Iterator[str]:
    """Non-empty lines of every document (what a tokenizer trainer wants to see)."""
    for document in iter_documents(paths, text_field):
        for line in document.split("\n"):
            if line.strip():
                yield line
