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


def test_parquet_arrow_saved_datasets_and_zstandard(tmp_path):
    """Every row of a table is a document; zstandard text and JSONL read like gzip ones; a saved dataset is its
    shards in order."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [f"document number {i} about the sea" for i in range(2500)]  # three Parquet batches
    pq.write_table(pa.table({"id": list(range(2500)), "text": rows}), tmp_path / "a.parquet")
    assert list(iter_documents([tmp_path / "a.parquet"])) == rows
    table = pa.table({"body": rows[:5]})
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    assert list(iter_documents([tmp_path / "b.arrow"], text_field="body")) == rows[:5]
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": rows[:300]}).save_to_disk(str(tmp_path / "saved"), num_shards=3)
    assert list(iter_documents([tmp_path / "saved"])) == rows[:300]
    for name, payload in [("c.txt.zst", "one book\nin two lines"), ("d.jsonl.zst", '{"text": "a"}\n{"text": "b"}')]:
        with pa.CompressedOutputStream(str(tmp_path / name), "zstd") as out:
            out.write(payload.encode())
    assert list(iter_documents([tmp_path / "c.txt.zst", tmp_path / "d.jsonl.zst"])) == ["one book\nin two lines",
                                                                                        "a", "b"]


def test_table_inputs_give_clear_errors(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"content": ["x"], "id": [1]}), tmp_path / "a.parquet")
    with pytest.raises(DataError, match=r"a.parquet: no column 'text' \(columns: content, id\); set --text_field"):
        list(iter_documents([tmp_path / "a.parquet"]))
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "n.parquet")
    with pytest.raises(DataError, match="n.parquet: row 1, column 'text' is int, not text"):
        list(iter_documents([tmp_path / "n.parquet"]))
    whole = (tmp_path / "a.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match="cut.parquet: not a readable parquet file"):
        list(iter_documents([tmp_path / "cut.parquet"]))
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataError, match="not a saved dataset"):
        expand_paths([tmp_path / "folder"])
