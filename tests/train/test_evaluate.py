"""Evaluations: `unmask eval mlm` (loss, accuracy, perplexity and token count, with a fixed masking seed); STS and
retrieval of sentence encoders against sentence-transformers; the `eval sts` / `eval retrieval` commands."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from conftest import shared_data
from unmask.config import BertConfig
from unmask.data.readers import read_sts
from unmask.errors import DataError
from unmask.models.bert import BertForMaskedLM
from unmask.pipelines.embed import SentenceEncoder
from unmask.train.evaluate import evaluate_sts


def test_eval_mlm_json(tmp_path, tokenizer, corpus_file):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64)
    BertForMaskedLM(config).save_pretrained(tmp_path / "model", tokenizer=tokenizer)
    cmd = [sys.executable, "-m", "unmask.cli", "eval", "mlm", "--model", str(tmp_path / "model"), "--file",
           str(corpus_file), "--json"]
    env = {"UNMASK_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    assert set(result) == {"loss", "accuracy", "perplexity", "tokens"}
    assert abs(result["loss"] - math.log(tokenizer.vocab_size)) < 0.5  # an untrained model guesses uniformly
    assert math.isclose(result["perplexity"], math.exp(result["loss"]), rel_tol=1e-9)
    assert 0 <= result["accuracy"] < 0.05 and result["tokens"] > 500
    again = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env).stdout)
    assert again == result  # fixed masking seed: comparable across runs and models


def test_sts_formats(tmp_path):
    release = tmp_path / "sts.csv"
    release.write_text("main-news\tMSRvid\t2012test\t0001\t5.000\tA man plays.\tA man is playing.\textra\n"
                       "main-news\tMSRvid\t2012test\t0002\t0.5\tA cat.\tThe economy.\n")
    first, second, scores = read_sts(release)
    assert first == ["A man plays.", "A cat."] and second[1] == "The economy." and scores.tolist() == [5.0, 0.5]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("left\tright\tgold\nA man plays.\tA man is playing.\t4.5\n")
    assert read_sts(tsv, "left", "right", "gold")[2].tolist() == [4.5]
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text(json.dumps({"s1": "a", "s2": "b", "label": 1}) + "\n")
    assert read_sts(jsonl, "s1", "s2", "label")[0] == ["a"]
    with pytest.raises(DataError, match="no column 'wrong' \\(columns: s1, s2, label\\)"):
        read_sts(jsonl, "s1", "s2", "wrong")
    csv = tmp_path / "pairs.csv"  # comma-separated, quoted as CSV writers quote
    csv.write_text('a,b,gold\n"A man, at home.",A man.,4.5\n')
    assert read_sts(csv, "a", "b", "gold") == (["A man, at home."], ["A man."], pytest.approx([4.5]))
    misnamed = tmp_path / "pairs-tabs.csv"
    misnamed.write_text("a\tb\tgold\nx\ty\t1\n")
    with pytest.raises(DataError, match="read as comma-separated \\(by its name\\), but its header is one column"):
        read_sts(misnamed, "a", "b", "gold")
    bad = tmp_path / "bad.csv"
    bad.write_text("only\tthree\tfields\n")
    with pytest.raises(DataError, match="bad.csv:1: expected 7 tab-separated fields"):
        read_sts(bad)


def test_sts_benchmark_dev_spearman_equals_sentence_transformers(minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    first, second, scores = read_sts(shared_data("stsb", "sts-dev.csv"))
    ours = evaluate_sts(SentenceEncoder.from_pretrained(minilm_dir), first, second, scores)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = st.SentenceTransformer(str(minilm_dir), device="cpu")
        a = model.encode(first, batch_size=64, convert_to_numpy=True, normalize_embeddings=True)
        b = model.encode(second, batch_size=64, convert_to_numpy=True, normalize_embeddings=True)
    scipy_stats = pytest.importorskip("scipy.stats")
    theirs = scipy_stats.spearmanr((a * b).sum(1), scores).statistic
    assert ours["pairs"] == 1500
    assert round(ours["spearman"], 4) == round(float(theirs), 4), (ours["spearman"], theirs)
    assert 0.85 < ours["spearman"] < 0.90  # all-MiniLM-L6-v2 on STS-B dev


def test_eval_commands(tmp_path, minilm_dir):
    sts = tmp_path / "sts.csv"
    rows = [("A man is playing a guitar.", "A man plays the guitar.", 4.8), ("A dog runs.", "A cat sleeps.", 1.0),
            ("The market fell.", "Stocks dropped sharply.", 4.0), ("A woman cooks.", "The train is late.", 0.0)]
    sts.write_text("".join(f"g\tf\ty\t{i}\t{s}\t{a}\t{b}\n" for i, (a, b, s) in enumerate(rows)))
    run = [sys.executable, "-m", "unmask.cli", "eval", "sts", "--model", str(minilm_dir), "--file", str(sts), "--json"]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) == {"spearman", "pearson", "pairs"} and result["pairs"] == 4 and result["spearman"] > 0.7

    corpus, queries, qrels = tmp_path / "corpus.jsonl", tmp_path / "queries.jsonl", tmp_path / "qrels.tsv"
    docs = {"d1": "Guitars have six strings and are played by plucking.", "d2": "The stock market fell on Monday.",
            "d3": "Cats sleep for most of the day.", "d4": "Trains in the north are often late."}
    corpus.write_text("".join(json.dumps({"_id": k, "title": "", "text": v}) + "\n" for k, v in docs.items()))
    queries.write_text(json.dumps({"_id": "q1", "text": "how many strings does a guitar have"}) + "\n" +
                       json.dumps({"_id": "q2", "text": "why was the train delayed"}) + "\n")
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td4\t1\n")
    run = [sys.executable, "-m", "unmask.cli", "eval", "retrieval", "--model", str(minilm_dir), "--corpus",
           str(corpus), "--queries", str(queries), "--qrels", str(qrels), "--json"]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result == {"ndcg@10": 1.0, "recall@100": 1.0, "mrr@10": 1.0, "queries": 2}


def test_eval_retrieval_reranks_the_top_k_as_transformers_scores_them(tmp_path, tokenizer):
    """--reranker: each query's first --rerank_top_k documents re-ordered by the cross-encoder's log-odds
    (transformers' l1 - l0 on the same weights, the document cut to fit), the rest in the retriever's order; the
    retriever's own nDCG@10 and MRR@10 reported beside."""
    transformers = pytest.importorskip("transformers")
    from unmask.example_data import write_example_data
    from unmask.metrics import retrieval_metrics
    from unmask.models.bert import BertForSequenceClassification
    from unmask.pipelines.bm25 import BM25

    torch.manual_seed(0)  # wide initial weights: distinct documents' scores apart by more than float noise
    reranker = tmp_path / "reranker"
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=2, initializer_range=0.5)
    BertForSequenceClassification(config).save_pretrained(reranker, tokenizer=tokenizer)
    write_example_data(tmp_path)
    files = {name: str(tmp_path / "scifact" / file) for name, file in
             (("corpus", "corpus.jsonl"), ("queries", "queries.train.jsonl"), ("qrels", "qrels/train.tsv"))}
    done = subprocess.run([sys.executable, "-m", "unmask.cli", "eval", "retrieval", "--bm25", "--reranker",
                           str(reranker), "--rerank_top_k", "5", "--truncation", "truncate",
                           "--reranker_max_length", "128", "--json", *(f"--{k}={v}" for k, v in files.items())],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)

    from unmask.data.readers import read_beir

    doc_ids, doc_texts, query_ids, query_texts, relevance = read_beir(**files)
    top = BM25(doc_texts).search(query_texts, 100)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(reranker).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(reranker)
    expected = []
    for query, row in zip(query_texts, top):
        inputs = hf_tokenizer([query] * 5, [doc_texts[d] for d in row[:5]], truncation="only_second", max_length=128,
                              padding=True, return_tensors="pt")
        with torch.no_grad():
            logits = model(**inputs).logits
        scores = (logits[:, 1] - logits[:, 0]).numpy().round(4)  # a repeated document: the same score, kept in order
        order = np.argsort(-scores, kind="stable").tolist()
        expected.append([doc_ids[row[i]] for i in order] + [doc_ids[d] for d in row[5:]])
    assert result == pytest.approx({**retrieval_metrics(expected, query_ids, relevance),
                                    "retriever_ndcg@10": result["retriever_ndcg@10"],
                                    "retriever_mrr@10": result["retriever_mrr@10"]}, abs=1e-9)
    bm25 = retrieval_metrics([[doc_ids[d] for d in row] for row in top], query_ids, relevance)
    assert result["retriever_ndcg@10"] == bm25["ndcg@10"] and result["ndcg@10"] != bm25["ndcg@10"]
