"""SPLADE vectors: the differentiable pooling equals SPLADE's formula on full logits (values and gradients), long
inputs are read in windows and max-pooled, the inverted index scores dot products, and the commands that write and
score them."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from unmask.config import BertConfig
from unmask.models.bert import BertForMaskedLM
from unmask.pipelines.search import InvertedIndex
from unmask.pipelines.sparse import sparse_encode, splade_pool, splade_vectors


@pytest.fixture(scope="module")
def mlm(tokenizer):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return BertForMaskedLM(config)


def test_splade_pool_is_the_formula_on_full_logits_with_its_gradients(mlm, tokenizer):
    """max over real tokens of log(1 + relu(logits)), padding excluded: values and weight gradients."""
    ids = torch.tensor([[2, 40, 41, 42, 3], [2, 50, 3, 0, 0]])
    mask = (ids != 0).long()
    ours = splade_pool(mlm, ids, mask)  # (B, V)
    weights = torch.log1p(torch.relu(mlm(ids, mask).logits)) * mask[..., None]  # (B, T, V); 0 is the floor
    reference = weights.max(dim=1).values
    assert torch.allclose(ours, reference, atol=1e-5) and ours.shape == (2, tokenizer.vocab_size)
    grads = []
    for value in (ours, reference):
        mlm.zero_grad()
        (value * torch.linspace(0, 1, value.shape[1])).sum().backward()
        grads.append(mlm.cls.predictions.transform.dense.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-5)
    vectors = splade_vectors(mlm, [[2, 40, 41, 42, 3], [2, 50, 3]], [[0] * 5, [0] * 3], 0)
    assert list(vectors[1]) == sorted(vectors[1], key=lambda i: -vectors[1][i])  # largest first
    assert vectors[1] == pytest.approx({int(i): float(reference[1, i]) for i in reference[1].nonzero()[:, 0]},
                                       abs=1e-5)


def test_a_long_text_is_the_max_over_its_windows(mlm, tokenizer):
    text = " ".join(["the lighthouse keeper wrote a letter to the harbour"] * 8)
    assert len(tokenizer.encode_batch([text])[0].ids) > 32
    whole = sparse_encode(mlm, tokenizer, [text])[0]
    cut = sparse_encode(mlm, tokenizer, [text], truncation="truncate")[0]
    assert all(whole.get(i, 0) >= w - 1e-6 for i, w in cut.items()) and whole != cut  # more of the text, max-pooled
    assert len(whole) > 0 and sparse_encode(mlm, tokenizer, ["short one"])[0] == \
        sparse_encode(mlm, tokenizer, ["short one"], truncation="error")[0]


def test_the_inverted_index_scores_dot_products():
    rng = np.random.default_rng(0)
    dense_docs = rng.random((30, 50)) * (rng.random((30, 50)) < 0.2)
    dense_queries = rng.random((4, 50)) * (rng.random((4, 50)) < 0.3)

    def as_dicts(matrix):
        return [{int(j): float(row[j]) for j in row.nonzero()[0]} for row in matrix]

    index = InvertedIndex(as_dicts(dense_docs))
    for query, dense in zip(as_dicts(dense_queries), dense_queries):
        assert np.allclose(index.scores(query), dense_docs @ dense, atol=1e-5)
    top = index.search(as_dicts(dense_queries), 5)
    expected = np.argsort(-(dense_queries @ dense_docs.T), axis=1, kind="stable")[:, :5]
    assert (top == expected).all()


def test_embed_and_eval_retrieval_read_splade_vectors(tmp_path, mlm, tokenizer):
    from unmask.example_data import write_example_data

    mlm.save_pretrained(tmp_path / "mlm", tokenizer=tokenizer)
    (tmp_path / "sentences.txt").write_text("the keeper wrote a letter\nthe harbour at night\n")
    run = [sys.executable, "-m", "unmask.cli"]
    done = subprocess.run([*run, "embed", str(tmp_path / "mlm"), "--sparse", "--input", str(tmp_path / "sentences.txt"),
                           "--output", str(tmp_path / "v.jsonl")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    expected = sparse_encode(mlm, tokenizer, ["the keeper wrote a letter", "the harbour at night"])
    assert [{int(k): v for k, v in line.items()} for line in lines] == [pytest.approx(e, abs=1e-5) for e in expected]
    write_example_data(tmp_path / "data")
    beir = [f"--{name}={tmp_path / 'data' / 'scifact' / file}" for name, file in
            (("corpus", "corpus.jsonl"), ("queries", "queries.train.jsonl"), ("qrels", "qrels/train.tsv"))]
    done = subprocess.run([*run, "eval", "retrieval", str(tmp_path / "mlm"), "--sparse", "--json", *beir],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)) == {"ndcg@10", "recall@100", "mrr@10", "queries"}
    done = subprocess.run([*run, "embed", str(tmp_path / "mlm"), "--sparse", "--dimensions", "8", "--input",
                           str(tmp_path / "sentences.txt"), "--output", str(tmp_path / "x")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "--dimensions and --normalize are for dense vectors" in done.stderr
