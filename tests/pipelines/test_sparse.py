"""SPLADE vectors: the differentiable pooling equals SPLADE's formula on full logits (values and gradients), long
inputs are read in windows and max-pooled, the inverted index scores dot products, and the commands that write and
score them."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import torch

from unmask.config import BertConfig
from unmask.data.windows import make_windows
from unmask.models.bert import BertForMaskedLM
from unmask.pipelines import search
from unmask.pipelines.search import InvertedIndex, SparseVectors
from unmask.pipelines.sparse import lower_to_sparse, sparse_encode, splade_pool, splade_vectors


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
    assert np.allclose(vectors.dense(), reference.detach().numpy(), atol=1e-5)
    as_dict = vectors.as_dict(1)
    assert list(as_dict) == sorted(as_dict, key=lambda i: -as_dict[i])  # largest first
    expected = reference[1].detach()
    assert as_dict == pytest.approx({int(i): float(expected[i]) for i in expected.nonzero()[:, 0]}, abs=1e-5)


def test_a_long_text_is_the_max_over_its_windows(mlm, tokenizer):
    text = " ".join(["the lighthouse keeper wrote a letter to the harbour"] * 8)
    assert len(tokenizer.encode_batch([text])[0].ids) > 32
    whole = sparse_encode(mlm, tokenizer, [text]).dense()[0]
    with pytest.warns(UserWarning, match="1 of 1 inputs were longer"):
        cut = sparse_encode(mlm, tokenizer, [text], truncation="truncate").dense()[0]
    assert (whole >= cut - 1e-6).all() and (whole > cut).any()  # more of the text, max-pooled
    windows = make_windows([(e.ids, e.type_ids) for e in tokenizer.encode_batch([text])], 32, "chunk", None)
    each = splade_vectors(mlm, windows.input_ids, windows.token_type_ids, 0).dense()
    assert len(each) > 1 and np.allclose(whole, each.max(axis=0), atol=1e-6)
    with pytest.warns(UserWarning, match="1 of 2 inputs were longer"):
        short = [sparse_encode(mlm, tokenizer, ["short one", text], truncation=t) for t in ("chunk", "truncate")]
    assert np.array_equal(short[0].row(0)[0], short[1].row(0)[0]) and short[0].row(0)[1].sum() > 0


def test_lowering_the_head_keeps_the_masked_lm_and_makes_the_vectors_sparse(mlm, tokenizer):
    """The bias moves by one constant: the same softmax, and a typical token then has `terms` vocabulary entries
    above zero; a second call finds nothing to lower."""
    model = copy.deepcopy(mlm).eval()
    with torch.no_grad():
        model.get_output_embeddings().bias += 3.0  # logits centred above zero: dense vectors
    texts, k = ["the keeper wrote a letter to the harbour", "the lighthouse at night", "a ship came in"], 15
    ids = [e.ids for e in tokenizer.encode_batch(texts)]
    batch = torch.tensor([ids[0]])
    with torch.no_grad():
        before = model(batch, torch.ones_like(batch)).logits
        dense = sparse_encode(model, tokenizer, texts)
        shift = lower_to_sparse(model, ids, 0, terms=k)
        after = model(batch, torch.ones_like(batch)).logits
    assert shift > 3.0 and torch.allclose(before - shift, after, atol=1e-5)
    assert torch.allclose(before.softmax(-1), after.softmax(-1), atol=1e-6)  # the masked LM predicts the same
    above = (after[0] > 0).sum(dim=1).float()  # (T,) each token's vocabulary entries above zero
    assert k / 2 <= above.median() <= 2 * k, (k, above)
    sparse = sparse_encode(model, tokenizer, texts)
    assert len(sparse.values) < 0.5 * len(dense.values), (len(sparse.values), len(dense.values))
    assert abs(lower_to_sparse(model, ids, 0, terms=k)) < 1e-4


def from_dense(matrix: np.ndarray) -> SparseVectors:
    return SparseVectors.from_rows([(row.nonzero()[0], row[row.nonzero()[0]]) for row in matrix], matrix.shape[1])


def test_the_inverted_index_scores_dot_products(monkeypatch):
    rng = np.random.default_rng(0)
    dense_docs = rng.random((30, 50)) * (rng.random((30, 50)) < 0.2)
    dense_queries = rng.random((4, 50)) * (rng.random((4, 50)) < 0.3)

    index = InvertedIndex(from_dense(dense_docs))
    assert np.allclose(index.scores(from_dense(dense_queries)), dense_queries @ dense_docs.T, atol=1e-5)
    top = index.search(from_dense(dense_queries), 5)
    expected = np.argsort(-(dense_queries @ dense_docs.T), axis=1, kind="stable")[:, :5]
    assert (top == expected).all()
    monkeypatch.setattr(search, "SCORE_BLOCK", 30)  # a query at a time
    assert (index.search(from_dense(dense_queries), 5) == expected).all()
    assert index.search(from_dense(dense_queries[:0]), 5).shape == (0, 5)


def test_dense_vectors_are_held_in_eight_bytes_a_weight(tokenizer):
    """An undertrained model's SPLADE vectors are dense (every vocabulary entry non-zero): they and their inverted
    index are held as arrays, 8 bytes a weight, never as Python objects a weight."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=4096, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32)
    model = BertForMaskedLM(config).eval()
    texts = [f"the keeper wrote letter {i} to the harbour" for i in range(300)]
    tracemalloc.start()
    try:
        vectors = sparse_encode(model, tokenizer, texts, batch_size=32)
        held = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        top = InvertedIndex(vectors).search(vectors[:50], 10)
        searching = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    weights = len(vectors.values)
    assert weights > 0.9 * len(texts) * 4096  # dense
    assert held < 2.5 * 8 * weights and searching < 6 * 8 * weights, (held, searching, weights)
    dense = vectors.dense()
    assert (top == np.argsort(-(dense[:50] @ dense.T), axis=1, kind="stable")[:, :10]).all()


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
    assert [{int(k): v for k, v in line.items()} for line in lines] == [
        pytest.approx(expected.as_dict(i), abs=1e-5) for i in range(2)]
    assert [list(line) for line in lines] == [[str(k) for k in expected.as_dict(i)] for i in range(2)]
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
