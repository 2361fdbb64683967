"""The clients people point at an embedding server, unmodified, against `unmask serve` on loopback: `openai` and
`huggingface_hub.InferenceClient`. Every answer equals sentence-transformers' or `transformers`' offline one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
huggingface_hub = pytest.importorskip("huggingface_hub")
transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")

TEXTS = ["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell sharply today.",
         "naïve café owners serve crème brûlée"]


@pytest.fixture(scope="module")
def minilm(minilm_dir, server_class):
    server = server_class(minilm_dir)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reference(minilm_dir):
    return sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")


@pytest.fixture(scope="module")
def tiny_servers(model_dirs, server_class):
    started = {name: server_class(model_dirs[name]) for name in ("classify", "fill-mask", "tag")}
    yield started
    for server in started.values():
        server.stop()


def _close(a, b, tolerance: float = 1e-5) -> bool:
    """Every row of `a` has cosine >= 1 - tolerance with the row of `b`."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    cosine = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    return a.shape == b.shape and bool((cosine >= 1 - tolerance).all())


def test_openai_embeddings_float_base64_and_dimensions(minilm, reference):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{minilm.port}/v1", api_key="unused")
    want = reference.encode(TEXTS, normalize_embeddings=True)
    answer = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)  # the client asks for base64
    assert _close([d.embedding for d in answer.data], want) and [d.index for d in answer.data] == [0, 1, 2, 3]
    tokens = sum(len(ids) for ids in reference.tokenizer(TEXTS)["input_ids"])
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == tokens
    floats = client.embeddings.create(model="m", input=TEXTS[0], encoding_format="float")
    assert _close([floats.data[0].embedding], want[:1])
    short = client.embeddings.create(model="m", input=TEXTS, dimensions=128)
    truncated = reference.encode(TEXTS, normalize_embeddings=True, truncate_dim=128)
    truncated /= np.linalg.norm(truncated, axis=1, keepdims=True)
    assert _close([d.embedding for d in short.data], truncated)
    assert abs(np.linalg.norm(short.data[0].embedding) - 1) < 1e-5
    ids = reference.tokenizer(TEXTS[:2])["input_ids"]  # token ids are inputs too
    assert _close([d.embedding for d in client.embeddings.create(model="m", input=ids).data], want[:2])
    with pytest.raises(openai.UnprocessableEntityError, match="dimensions must be between 1 and the model's 384"):
        client.embeddings.create(model="m", input=TEXTS[0], dimensions=1000)


def test_inference_client_feature_extraction_and_sentence_similarity(minilm, reference):
    client = huggingface_hub.InferenceClient(base_url=f"http://127.0.0.1:{minilm.port}")
    vectors = client.feature_extraction(TEXTS[0])
    assert _close(np.asarray(vectors).reshape(1, -1), reference.encode(TEXTS[:1], normalize_embeddings=True))
    scores = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    want = reference.similarity(reference.encode(TEXTS[:1]), reference.encode(TEXTS[1:]))[0].numpy()
    assert np.abs(np.asarray(scores) - want).max() < 1e-5


def test_inference_client_text_classification_with_top_k(tiny_servers, model_dirs):
    client = huggingface_hub.InferenceClient(base_url=f"http://127.0.0.1:{tiny_servers['classify'].port}")
    pipeline = transformers.pipeline("text-classification", model=str(model_dirs["classify"]), device="cpu")
    for top_k in (1, 2):
        got = client.text_classification("the old sailor remembered", top_k=top_k)
        want = pipeline("the old sailor remembered", top_k=top_k)
        assert [g.label for g in got] == [w["label"] for w in want]
        assert max(abs(g.score - w["score"]) for g, w in zip(got, want)) < 1e-5


def test_inference_client_fill_mask_and_token_classification(tiny_servers, model_dirs):
    fill = huggingface_hub.InferenceClient(base_url=f"http://127.0.0.1:{tiny_servers['fill-mask'].port}")
    pipeline = transformers.pipeline("fill-mask", model=str(model_dirs["fill-mask"]), device="cpu")
    got = fill.fill_mask("the old [MASK] remembered the lighthouse", top_k=2)
    want = pipeline("the old [MASK] remembered the lighthouse", top_k=2)
    assert len(got) == 2 and [g.token for g in got] == [w["token"] for w in want]
    assert max(abs(g.score - w["score"]) for g, w in zip(got, want)) < 1e-5
    tag = huggingface_hub.InferenceClient(base_url=f"http://127.0.0.1:{tiny_servers['tag'].port}")
    pipeline = transformers.pipeline("token-classification", model=str(model_dirs["tag"]), device="cpu",
                                     aggregation_strategy="first")
    text = "our teacher misunderstood a letter from Lisbon before dawn"
    got, want = tag.token_classification(text), pipeline(text)
    assert want  # random weights still tag something: the comparison is not of empties
    assert [(g.entity_group, g.start, g.end) for g in got] == [(w["entity_group"], w["start"], w["end"]) for w in want]
    assert max(abs(g.score - w["score"]) for g, w in zip(got, want)) < 1e-5


def test_one_score_per_pair_everywhere(tmp_path, tokenizer, server_class):
    """A one-label cross-encoder: /predict and /rerank give the sigmoid (as sentence-transformers' CrossEncoder),
    the logit with raw_scores."""
    from unmask.config import BertConfig
    from unmask.models.bert import BertForSequenceClassification

    torch.manual_seed(1)
    model = BertForSequenceClassification(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32,
                                                     num_hidden_layers=2, num_attention_heads=2,
                                                     intermediate_size=64, num_labels=1))
    model.save_pretrained(tmp_path / "reranker", tokenizer=tokenizer)
    cross = sentence_transformers.CrossEncoder(str(tmp_path / "reranker"), device="cpu")
    pair = ["the old sailor", "remembered the lighthouse"]
    want = float(cross.predict([pair])[0])
    server = server_class(tmp_path / "reranker")
    try:
        _, predicted = server.call("POST", "/predict", {"inputs": pair})
        _, ranked = server.call("POST", "/rerank", {"query": pair[0], "texts": [pair[1]]})
        _, raw = server.call("POST", "/predict", {"inputs": pair, "raw_scores": True})
        _, info = server.call("GET", "/info")
    finally:
        server.stop()
    assert abs(predicted[0]["score"] - want) < 1e-5 and abs(ranked[0]["score"] - want) < 1e-5
    assert abs(raw[0]["score"] - np.log(want / (1 - want))) < 1e-4
    assert "reranker" in info["model_type"]
