"""`unmask example-data`: every file the README's examples read, in the format its reader expects, the same for a
seed."""

from __future__ import annotations

from unmask.data.readers import read_beir, read_conll, read_sentences, read_sts, read_table
from unmask.data.sources import iter_documents
from unmask.example_data import write_example_data


def test_the_sample_is_in_each_readers_format(tmp_path):
    files = write_example_data(tmp_path)
    assert len(files) == 18 and all(f.stat().st_size > 0 for f in files)
    reviews = read_table(tmp_path / "sst2" / "train.tsv")
    assert len(reviews) == 400 and {r["label"] for r in reviews} == {"0", "1"}
    sentences, tags = read_conll(tmp_path / "conll2003" / "train.txt")
    assert len(sentences) == 300 and {"B-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "O"} == {t for s in tags for t in s}
    first, second, scores = read_sts(tmp_path / "stsb" / "sts-dev.csv")
    assert len(first) == 100 and 0 <= scores.min() < 1 and 4 < scores.max() <= 5
    assert len(read_sts(tmp_path / "pairs.tsv", "a", "b", "gold")[2]) == 50
    doc_ids, _, query_ids, _, relevance = read_beir(*(tmp_path / "scifact" / name for name in
                                                      ("corpus.jsonl", "queries.train.jsonl", "qrels/train.tsv")))
    assert len(doc_ids) == 200 and len(query_ids) == len(relevance) == 67
    assert len(read_sentences(str(tmp_path / "sentences.txt"))) == 50
    shards = sorted((tmp_path / "shards").iterdir())
    assert [len(list(iter_documents([shard]))) for shard in shards] == [40, 40]


def test_the_same_seed_writes_the_same_bytes(tmp_path):
    one, two = (write_example_data(tmp_path / name, seed=3) for name in ("one", "two"))
    for a, b in zip(one, two):
        assert a.read_bytes() == b.read_bytes(), a.name
    write_example_data(tmp_path / "other", seed=4)
    assert (tmp_path / "one" / "sst2" / "dev.tsv").read_text() != (tmp_path / "other" / "sst2" / "dev.tsv").read_text()
