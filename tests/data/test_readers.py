"""The readers refuse what is not their format, and say which format they expected."""

from __future__ import annotations

import json

import pytest

from unmask.data.readers import read_beir, read_conll, read_table
from unmask.errors import DataError

SST2_LIKE = ("sentence\tlabel\nhide new secretions from the parental units \t0\n"
             "contains no wit , only labored gags \t0\n")


def test_conll_refuses_a_table_of_sentences(tmp_path):
    table = tmp_path / "train.tsv"  # SST-2's layout: the header would become a token, the labels tags
    table.write_text(SST2_LIKE)
    with pytest.raises(DataError, match=r"train.tsv:2: a field of several words .* one token per line"):
        read_conll(table)
    conll = tmp_path / "train.conll"
    conll.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter\tB-PER\n")
    assert read_conll(conll) == ([["EU", "rejects"], ["Peter"]], [["B-ORG", "O"], ["B-PER"]])


def test_a_table_is_read_by_its_delimiter_and_a_wrong_one_is_named(tmp_path):
    for name, text in (("a.tsv", "x\ty\n1\t2\n"), ("a.csv", "x,y\n1,2\n"), ("a.txt", "x,y\n1,2\n")):
        (tmp_path / name).write_text(text)
        assert read_table(tmp_path / name) == [{"x": "1", "y": "2"}], name
    (tmp_path / "b.tsv").write_text("x,y\n1,2\n")
    with pytest.raises(DataError, match=r"b.tsv: read as tab-separated \(by its name\), but its header is one column "
                                        r"'x,y'; name it .csv"):
        read_table(tmp_path / "b.tsv")


def test_tables_follow_the_csv_quoting_rules_and_refuse_surplus_fields(tmp_path):
    quoted = tmp_path / "quoted.tsv"
    quoted.write_text('sentence\tlabel\n"a tab\there, and ""quotes"""\t1\nplain "inner" quotes\t0\n')
    assert read_table(quoted) == [{"sentence": 'a tab\there, and "quotes"', "label": "1"},
                                  {"sentence": 'plain "inner" quotes', "label": "0"}]
    surplus = tmp_path / "surplus.csv"
    surplus.write_text("sentence,label\ngood film,1\nbad, really bad film,0\n")
    with pytest.raises(DataError, match=r"surplus.csv:3: 3 fields, the header has 2; quote a field that holds"):
        read_table(surplus)


def _beir(tmp_path, qrels: str, corpus: list | None = None, queries: list | None = None):
    files = {"corpus": tmp_path / "corpus.jsonl", "queries": tmp_path / "queries.jsonl", "qrels": tmp_path / "q.tsv"}
    corpus = corpus or [{"_id": "d1", "title": "T", "text": "one"}, {"_id": "d2", "text": ""}]
    queries = queries or [{"_id": "q1", "text": "first"}, {"_id": "q2", "text": "second"}]
    files["corpus"].write_text("".join(json.dumps(d) + "\n" for d in corpus))
    files["queries"].write_text("".join(json.dumps(q) + "\n" for q in queries))
    files["qrels"].write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return {k: str(v) for k, v in files.items()}


@pytest.mark.parametrize("qrels, corpus, queries, problem", [
    ("q1\td1\t1\nq2\td9\t1\n", None, None, r"q.tsv:3: document 'd9' is not in .*corpus.jsonl"),
    ("q1\td1\t1\nq7\td1\t1\n", None, None, r"q.tsv:3: query 'q7' is not in .*queries.jsonl"),
    ("q1\td1\t1\nq2\td2\t2\n", None, None, r"q.tsv:3: document 'd2' is judged relevant but has no title or text"),
    ("q1\td1\thigh\n", None, None, r"q.tsv:2: expected query-id, corpus-id and an integer score"),
    ("q1\td1\n", None, None, r"q.tsv:2: expected query-id, corpus-id and an integer score"),
    ("q1\td1\t1\n", [{"title": "no id"}], None, r"corpus.jsonl:1: no '_id'"),
    ("q1\td1\t1\n", None, [{"_id": "q1", "text": "a"}, {"_id": "q2"}], r"queries.jsonl:2: no 'text'"),
    ("q1\td1\t1\n", None, [{"_id": "q1", "text": "a"}, ["q2"]], r"queries.jsonl:2: not a JSON object but a list"),
])
def test_beir_faults_name_the_file_and_line(tmp_path, qrels, corpus, queries, problem):
    with pytest.raises(DataError, match=problem):
        read_beir(**_beir(tmp_path, qrels, corpus, queries))


def test_beir_reads_title_and_text_joined_and_integer_valued_scores(tmp_path):
    doc_ids, doc_texts, query_ids, query_texts, relevance = read_beir(**_beir(tmp_path, "q1\td1\t1.0\nq1\td2\t0\n"))
    assert doc_texts == ["T one", ""] and query_ids == ["q1"] and relevance == {"q1": {"d1": 1, "d2": 0}}
