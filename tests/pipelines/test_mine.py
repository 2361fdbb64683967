"""Hard-negative mining: blockwise search equals a full ranking, negatives come from the rank range and are never
judged, the corpus vectors are reused on a second run, and the output is what finetune embed and pair read."""

from __future__ import annotations

import numpy as np
import pytest

from unmask.data.labelled import LabelledFormat, load_pairs, load_task_data
from unmask.data.readers import read_beir
from unmask.errors import UsageError
from unmask.example_data import write_example_data
from unmask.pipelines import mine
from unmask.pipelines.embed import SentenceEncoder


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sample")
    write_example_data(root)
    return {name: str(root / "scifact" / file) for name, file in
            (("corpus", "corpus.jsonl"), ("queries", "queries.train.jsonl"), ("qrels", "qrels/train.tsv"))}


def test_negatives_come_from_the_range_and_are_never_judged(tmp_path, minilm_dir, beir, tokenizer):
    encoder = SentenceEncoder.from_pretrained(minilm_dir)
    encoded, original = [], encoder.encode

    def counted(texts, **options):
        encoded.append(len(texts))
        return original(texts, **options)

    encoder.encode = counted
    rows, left_out = mine.mine_hard_negatives(encoder, minilm_dir, **beir, num_negatives=3, range_min=2,
                                              range_max=12, cache_dir=tmp_path / "cache")
    doc_ids, doc_texts, query_ids, query_texts, relevance = read_beir(**beir)
    assert left_out == 0 and len(rows) == len(query_ids) == 67  # one judged document per sample query
    docs = original(doc_texts, normalize=True)
    for q, row in enumerate(rows):
        assert row["anchor"] == query_texts[q]
        ranking = [doc_texts[i] for i in np.argsort(-(docs @ original([row["anchor"]], normalize=True)[0]))]
        judged = {doc_texts[doc_ids.index(d)] for d in relevance[query_ids[q]]}
        negatives = [row[f"negative_{i}"] for i in (1, 2, 3)]
        assert not judged & set(negatives) and row["positive"] in judged
        assert all(2 <= ranking.index(n) < 12 for n in negatives)  # ties aside: float16 vectors, exact ranks here
    assert encoded[0] == 200  # the corpus was embedded, then the queries
    encoded.clear()
    mine.mine_hard_negatives(encoder, minilm_dir, **beir, range_min=2, range_max=12, cache_dir=tmp_path / "cache")
    assert 200 not in encoded  # the second run read the corpus vectors from the cache

    output = tmp_path / "tuples.jsonl"
    mine.write_rows(rows, output)
    assert len(load_pairs(LabelledFormat(task="embed"), tokenizer, str(output)).negatives[0]) == 3
    ranking, _ = load_task_data(LabelledFormat(task="pair"), tokenizer, str(output), None)
    assert len(ranking) == len(rows) and {len(row) for row in ranking.candidates} == {4}


def test_the_corpus_is_embedded_a_chunk_at_a_time_into_its_cache(tmp_path, monkeypatch, minilm_dir, beir):
    """Chunks of the corpus give the vectors of one pass (float16), with the cache file and without one."""
    encoder = SentenceEncoder.from_pretrained(minilm_dir)
    doc_texts = read_beir(**beir)[1]
    whole = encoder.encode(doc_texts, normalize=True).astype(np.float16)
    monkeypatch.setattr(mine, "CORPUS_CHUNK", 64)  # 200 documents: 4 chunks, the last one short
    cached = mine.corpus_vectors(encoder, doc_texts, "key", tmp_path, batch_size=16)
    in_memory = mine.corpus_vectors(encoder, doc_texts, "key", None, batch_size=16)
    assert isinstance(cached, np.memmap) and (tmp_path / "key.npy").exists() and len(list(tmp_path.iterdir())) == 1
    for vectors in (cached, in_memory):
        assert vectors.dtype == np.float16 and np.abs(vectors.astype(np.float32) - whole).max() <= 1e-3


def test_a_range_beyond_the_corpus_is_refused(minilm_dir, beir):
    with pytest.raises(UsageError, match="--range_max 500 must satisfy .* the 200 documents"):
        mine.mine_hard_negatives(SentenceEncoder.from_pretrained(minilm_dir), minilm_dir, **beir, range_max=500)


def test_a_cross_encoder_rescores_filters_and_labels_the_negatives(tmp_path, minilm_dir, beir, tokenizer):
    """--cross_encoder: negatives are the candidates of the rank range it scores highest, --margin reads its scores,
    and each row's label holds its log-odds of the positive and of each negative (transformers' l1 - l0)."""
    transformers = pytest.importorskip("transformers")
    import torch

    from unmask.config import BertConfig
    from unmask.models.bert import BertForSequenceClassification
    from unmask.tokenizer import load_tokenizer

    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=2, initializer_range=0.5)
    model = BertForSequenceClassification(config)
    model.save_pretrained(tmp_path / "ce", tokenizer=tokenizer)
    encoder = SentenceEncoder.from_pretrained(minilm_dir)
    plain, _ = mine.mine_hard_negatives(encoder, minilm_dir, **beir, num_negatives=10, range_min=2, range_max=12,
                                        cache_dir=tmp_path / "cache")
    rows, left_out = mine.mine_hard_negatives(encoder, minilm_dir, **beir, num_negatives=2, range_min=2,
                                              range_max=12, margin=0.5, cache_dir=tmp_path / "cache",
                                              cross_encoder=(model, load_tokenizer(tmp_path / "ce")))
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "ce").eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "ce")

    def log_odds(query, documents):
        inputs = hf_tokenizer([query] * len(documents), documents, truncation="only_second", max_length=512,
                              padding=True, return_tensors="pt")
        with torch.no_grad():
            logits = reference(**inputs).logits
        return (logits[:, 1] - logits[:, 0]).tolist()

    assert len(rows) + left_out == 67 and len(rows) > 10
    by_anchor = {row["anchor"]: row for row in plain}  # every candidate of the range, in the bi-encoder's order
    for row in rows[:10]:
        candidates = [by_anchor[row["anchor"]][f"negative_{i}"] for i in range(1, 11)]
        scores = log_odds(row["anchor"], [row["positive"], *candidates])
        assert row["label"] == pytest.approx([scores[0], row["label"][1], row["label"][2]], abs=1e-4)
        allowed = sorted((s, c) for s, c in zip(scores[1:], candidates) if s <= scores[0] - 0.5)[::-1]
        assert [row["negative_1"], row["negative_2"]] == [c for _, c in allowed[:2]]
        assert row["label"][1:] == pytest.approx([s for s, _ in allowed[:2]], abs=1e-4)
