"""Text readers: Gutenberg stripping, JSONL fields, gzip, and clear errors for bad files."""

from __future__ import annotations

import gzip

import pytest

from conftest import shared_data
from unmask.data.sources import (
    expand_paths,
    iter_documents,
    iter_lines,
    strip_gutenberg,
)
from unmask.errors import DataError

GUTENBERG = (
    "\ufeffThe Project Gutenberg EBook of Something\r\nLicence text here\r\n"
    "*** START OF THIS PROJECT GUTENBERG EBOOK SOMETHING ***\r\n\r\nChapter 1\r\nIt was a dark night.\r\n"
    "*** END OF THIS PROJECT GUTENBERG EBOOK SOMETHING ***\r\nMore licence\r\n"
)


def test_gutenberg_header_and_licence_stripped(tmp_path):
    path = tmp_path / "book.txt"
    path.write_bytes(GUTENBERG.encode("utf-8"))
    (doc,) = list(iter_documents([path]))
    assert doc.strip() == "Chapter 1\nIt was a dark night."
    assert strip_gutenberg("no markers at all") == "no markers at all"
    assert strip_gutenberg("x\n***START OF THE PROJECT GUTENBERG EBOOK X***\nbody\n***END OF X***\n") == "body"


def test_jsonl_documents_and_errors(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "first doc"}\n\n{"text": "second doc"}\n')
    assert list(iter_documents([path])) == ["first doc", "second doc"]
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "ok"}\n{"content": "no text field"}\n')
    with pytest.raises(DataError, match=r"b.jsonl:2: no field 'text'"):
        list(iter_documents([bad]))
    broken = tmp_path / "c.jsonl"
    broken.write_text('{"text": "ok"\n')
    with pytest.raises(DataError, match=r"c.jsonl:1: not a JSON object"):
        list(iter_documents([broken]))


def test_non_utf8_and_corrupt_gzip_are_named(tmp_path):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 au lait".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.txt: not valid UTF-8 \(byte 3"):
        list(iter_documents([latin]))
    fake = tmp_path / "fake.txt.gz"
    fake.write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="fake.txt.gz: cannot be read"):
        list(iter_documents([fake]))


def test_globs_and_missing_files(tmp_path):
    for name in ["b.txt", "a.txt"]:
        (tmp_path / name).write_text(name)
    with gzip.open(tmp_path / "c.txt.gz", "wt") as f:
        f.write("zipped")
    assert [p.name for p in expand_paths([tmp_path / "*.txt*"])] == ["a.txt", "b.txt", "c.txt.gz"]
    assert list(iter_lines([tmp_path / "*.txt*"])) == ["a.txt", "b.txt", "zipped"]
    with pytest.raises(DataError, match="no file matches"):
        expand_paths([tmp_path / "*.md"])
    with pytest.raises(DataError, match="no such file"):
        expand_paths([tmp_path / "nope.txt"])
    with pytest.raises(DataError, match="is a directory"):
        expand_paths([tmp_path])


def test_real_gutenberg_books_are_stripped():
    books = sorted(shared_data("gutenberg", "valid").glob("*.txt"))
    for book, doc in zip(books, iter_documents(books)):
        assert "Project Gutenberg" not in doc[:2000] and "PROJECT GUTENBERG" not in doc[-2000:], book.name
        assert "\r" not in doc and not doc.startswith("\ufeff")
