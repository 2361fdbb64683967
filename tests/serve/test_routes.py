"""TEI 1.9's fields and routes on `unmask serve`, its bounded cost for any input, and hostile bodies answered 4xx."""

from __future__ import annotations

import json
import random
import shutil
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")

from unmask.serve.model import ServedModel, TokenIds  # noqa: E402
from unmask.serve.options import ServeOptions  # noqa: E402

TEXT = "the old sailor remembered the lighthouse"


@pytest.fixture(scope="module")
def prompted_dir(model_dirs, tmp_path_factory):
    """The tiny encoder with sentence-transformers prompts."""
    path = tmp_path_factory.mktemp("prompted") / "embed"
    shutil.copytree(model_dirs["embed"], path)
    (path / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "query: "}}))
    return path


@pytest.fixture(scope="module")
def embed_server(prompted_dir, server_class):
    server = server_class(prompted_dir)
    yield server
    server.stop()


def _long_text(n_words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = ["lighthouse", "naïve", "café", "東京", "tokenization", "a", "remembered", "!", "12.5", "ünïcödé"]
    return " ".join(rng.choice(words) for _ in range(n_words))


@pytest.mark.parametrize("direction", ["right", "left"])
def test_a_cut_keeps_exactly_the_tokens_tokenizers_truncation_keeps(model_dirs, direction):
    served = ServedModel(model_dirs["embed"])  # context 64
    backend = served.tokenizer.backend
    for seed in range(5):
        text = _long_text(3_000, seed)
        backend.enable_truncation(64, direction=direction)
        want_single = backend.encode(text).ids
        backend.enable_truncation(64, direction=direction, strategy="only_second")
        want_pair = backend.encode("a query", text).ids
        backend.no_truncation()
        single, pair = served.fit([text, ("a query", text)], mode="truncate", direction=direction)
        assert single.ids == want_single and pair.ids == want_pair and len(single.ids) == 64
    with pytest.raises(Exception, match="longer than the maximum of 64 tokens"):
        served.fit([_long_text(100)], mode="error")
    ids = TokenIds(list(range(5, 105)))
    assert served.fit([ids], mode="truncate", direction=direction)[0].ids == (ids.ids[:64] if direction == "right"
                                                                            else ids.ids[-64:])


def test_the_work_is_bounded_by_what_is_kept_not_by_what_is_sent(embed_server):
    """Seconds per request: a 1M-character text with truncation costs what its first window costs; the worst a 2 MB
    body can hold (one word of 1.9M characters, which must be read whole to know its tokens) stays bounded too."""
    embed_server.call("POST", "/embed", {"inputs": TEXT})  # warm
    bodies = [({"inputs": _long_text(150_000), "truncate": True}, 1.0),  # about 1M characters
              ({"inputs": [_long_text(2_000, seed) for seed in range(32)], "truncate": True}, 1.0),
              ({"inputs": "  " * 900_000 + TEXT, "truncate": True, "truncation_direction": "left"}, 1.0),
              ({"inputs": "x" * 1_900_000, "truncate": True}, 3.0)]
    for body, limit in bodies:
        started = time.perf_counter()
        status, vectors = embed_server.call("POST", "/embed", body)
        assert status == 200 and time.perf_counter() - started < limit, (status, time.perf_counter() - started)
    status, error = embed_server.call("POST", "/embed", {"inputs": _long_text(150_000)})
    assert status == 413 and "longer than the maximum of 64 tokens" in error["error"]


def test_prompts_dimensions_token_ids_and_left_truncation(embed_server, prompted_dir):
    encoder_dir = prompted_dir
    from unmask.pipelines.embed import SentenceEncoder

    encoder = SentenceEncoder.from_pretrained(encoder_dir)
    _, prompted = embed_server.call("POST", "/embed", {"inputs": TEXT, "prompt_name": "query"})
    assert np.abs(np.array(prompted) - encoder.encode(["query: " + TEXT], normalize=True)).max() < 1e-5
    status, error = embed_server.call("POST", "/embed", {"inputs": TEXT, "prompt_name": "passage"})
    assert status == 422 and "not one of the model's prompts: query" in error["error"]
    _, full = embed_server.call("POST", "/embed", {"inputs": TEXT, "normalize": False})
    _, short = embed_server.call("POST", "/embed", {"inputs": TEXT, "dimensions": 8})
    cut = np.array(full[0][:8])
    assert np.abs(np.array(short[0]) - cut / np.linalg.norm(cut)).max() < 1e-6
    for bad in (0, 33):
        status, error = embed_server.call("POST", "/embed", {"inputs": TEXT, "dimensions": bad})
        assert status == 422 and "dimensions must be between 1 and the model's 32" in error["error"]
    ids = encoder.tokenizer.encode(TEXT)
    _, from_ids = embed_server.call("POST", "/embed", {"inputs": [ids]})
    _, from_text = embed_server.call("POST", "/embed", {"inputs": [TEXT]})
    assert np.abs(np.array(from_ids) - np.array(from_text)).max() < 1e-6
    status, error = embed_server.call("POST", "/embed", {"inputs": [[1, 2, 10**6]]})
    assert status == 422 and "token ids must lie in [0, 300)" in error["error"]


def test_main_route_health_decode_tokenize_and_similarity(embed_server):
    assert embed_server.call("GET", "/")[0] == 200 and embed_server.call("GET", "/ping")[0] == 200
    _, direct = embed_server.call("POST", "/embed", {"inputs": TEXT})
    for path in ("/", "/invocations"):
        status, dispatched = embed_server.call("POST", path, {"inputs": TEXT})
        assert status == 200 and np.abs(np.array(dispatched) - np.array(direct)).max() < 1e-6
    _, scores = embed_server.call("POST", "/similarity", {"inputs": {"source_sentence": TEXT,
                                                                      "sentences": [TEXT, "a letter"]}})
    assert abs(scores[0] - 1) < 1e-5 and len(scores) == 2
    _, tokens = embed_server.call("POST", "/tokenize", {"inputs": "naïve café"})
    words = [t for t in tokens[0] if not t["special"]]
    raw = "naïve café".encode()
    assert words[0]["start"] == 0 and words[-1]["stop"] == len(raw) == 12  # UTF-8 bytes, not characters
    ids = [t["id"] for t in tokens[0]]
    assert embed_server.call("POST", "/decode", {"ids": ids})[1] == ["naive cafe"]
    decoded = embed_server.call("POST", "/decode", {"ids": [ids, ids[:2]], "skip_special_tokens": False})[1]
    assert decoded[1].startswith("[CLS] n") and decoded[0].endswith("[SEP]")
    status, all_tokens = embed_server.call("POST", "/embed_all", {"inputs": [TEXT, "a letter"]})
    assert status == 200 and [len(x) for x in all_tokens] == [len(embed_server.call(
        "POST", "/tokenize", {"inputs": t})[1][0]) for t in (TEXT, "a letter")] and len(all_tokens[0][0]) == 32


def test_predict_reads_inputs_as_tei_does(model_dirs, server_class):
    server = server_class(model_dirs["classify"])
    try:
        _, pair = server.call("POST", "/predict", {"inputs": ["the old sailor", "remembered"]})
        _, batch = server.call("POST", "/predict", {"inputs": [["the old sailor", "remembered"], ["a letter"]]})
        _, singles = server.call("POST", "/predict", {"inputs": [["the old sailor"], ["remembered"]]})
        status, error = server.call("POST", "/predict", {"inputs": ["a", "b", "c"]})
        _, hf = server.call("POST", "/", {"inputs": "the old sailor", "parameters": {"top_k": 1}})
    finally:
        server.stop()
    assert isinstance(pair[0], dict) and pair == batch[0]  # a flat pair is one input
    assert len(singles) == 2 and singles[0] != pair
    assert status == 422 and "one pair [a, b], got 3 strings" in error["error"]
    assert len(hf) == 1 and len(hf[0]) == 1  # the Hugging Face shape: a list per input, top_k honoured


@pytest.mark.parametrize("raw,needle", [
    (b"[" * 1000 + b"]" * 1000, "nested too deeply"),
    (b'{"inputs": ' + b"7" * 5000 + b"}", "malformed JSON"),
    (b'{"inputs": "\\ud800"}', "lone UTF-16 surrogate"),
    (b'{"inputs": NaN}', "NaN is not JSON"),
    (b'{"inputs": "a", "normalize": Infinity}', "Infinity is not JSON"),
])
def test_hostile_bodies_are_a_4xx_not_a_500(embed_server, raw, needle):
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", embed_server.port, timeout=60)
    for body in (raw, json.dumps({"inputs": TEXT}).encode()):  # the connection stays open for the next request
        connection.request("POST", "/embed", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
        if body is raw:
            assert response.status == 400 and needle in answer["error"], (response.status, answer)
        else:
            assert response.status == 200 and len(answer) == 1
    connection.close()


def test_made_up_paths_add_no_metrics_series(embed_server):
    before = len(embed_server.call("GET", "/metrics")[1])
    for k in range(300):
        embed_server.call("GET", f"/made-up-{k}")
    after = len(embed_server.call("GET", "/metrics")[1])
    assert after - before < 500, after - before


def test_served_options_are_checked():
    with pytest.raises(Exception, match="exclude each other"):
        ServeOptions(default_prompt_name="query", default_prompt="query: ")


def test_api_key_guards_model_routes_and_leaves_health_open(model_dirs, server_class, minilm_dir):
    openai = pytest.importorskip("openai")
    server = server_class(minilm_dir, "--api_key", "s3cret", "--served_model_name", "minilm")
    try:
        status, error = server.call("POST", "/embed", {"inputs": TEXT})
        assert status == 401 and error["error_type"] == "Unauthorized"
        assert server.call("GET", "/health")[0] == 200 and server.call("GET", "/metrics")[0] == 200
        assert server.call("POST", "/embed", {"inputs": TEXT}, headers={"Authorization": "Bearer s3cret"})[0] == 200
        good = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="s3cret")
        assert good.embeddings.create(model="minilm", input=TEXT).model == "minilm"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="wrong").embeddings.create(
                model="minilm", input=TEXT)
        status, info = server.call("GET", "/info", headers={"Authorization": "Bearer s3cret"})
        assert info["model_id"] == "minilm" and str(minilm_dir) not in json.dumps(info)  # no absolute path shown
    finally:
        server.stop()


def test_timing_headers_and_bounded_fill_mask(model_dirs, server_class):
    import http.client

    server = server_class(model_dirs["fill-mask"], "--max_fill_mask_answers", "1000")
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        connection.request("POST", "/fill-mask", body=json.dumps({"inputs": "the old [MASK] sailor"}),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        headers = {k.lower(): v for k, v in response.getheaders()}
        for name in ("compute-time", "compute-tokens", "queue-time", "inference-time", "tokenization-time",
                     "total-time"):
            assert int(headers[f"x-{name}"]) >= 0
        assert int(headers["x-compute-tokens"]) == 6
        many = " ".join(["[MASK]"] * 60)
        started = time.perf_counter()
        status, error = server.call("POST", "/fill-mask", {"inputs": many, "top_k": 50})
        assert status == 413 and "60 masks x top_k 50 = 3000 answers" in error["error"]
        assert time.perf_counter() - started < 1.0
        status, answers = server.call("POST", "/fill-mask", {"inputs": "the [MASK] sailor", "top_k": 10**6})
        assert status == 200 and len(answers) == 300  # top_k is at most the vocabulary
    finally:
        server.stop()


def test_requests_beyond_the_concurrency_cap_get_429():
    """The gate in front of the app: with one request in flight and a cap of one, the next is refused at once."""
    import asyncio

    from unmask.serve.server import Gate, Metrics

    class Service:
        options, metrics = ServeOptions(max_concurrent_requests=1), Metrics()

    release = asyncio.Event()

    async def slow_app(scope, receive, send):
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def scenario():
        gate, sent = Gate(slow_app, Service()), {1: [], 2: []}
        scope = {"type": "http", "method": "POST", "path": "/embed", "headers": []}
        first = asyncio.create_task(gate(scope, None, lambda m: _append(sent[1], m)))
        await asyncio.sleep(0)  # the first request is now in flight
        await gate(scope, None, lambda m: _append(sent[2], m))
        release.set()
        await first
        return sent

    sent = asyncio.run(scenario())
    assert sent[2][0]["status"] == 429 and b"Overloaded" in sent[2][1]["body"] and sent[1][0]["status"] == 200


async def _append(messages: list, message: dict) -> None:
    messages.append(message)


def test_embed_sparse_serves_splade_vectors_of_a_masked_lm(model_dirs, server_class):
    import subprocess
    import sys

    import torch

    from unmask.models import from_pretrained
    from unmask.tokenizer import Tokenizer

    texts = ["the old sailor remembered", "a letter"]
    model = from_pretrained(model_dirs["fill-mask"], "masked-lm").eval()
    tokenizer = Tokenizer.from_pretrained(model_dirs["fill-mask"])
    server = server_class(model_dirs["fill-mask"], "--pooling", "splade")
    try:
        status, vectors = server.call("POST", "/embed_sparse", {"inputs": texts})
        _, via_main = server.call("POST", "/", {"inputs": texts[1]})
        _, filled = server.call("POST", "/fill-mask", {"inputs": "the [MASK] sailor"})
    finally:
        server.stop()
    alone = {e["index"]: e["value"] for e in via_main[0]}
    batched = {e["index"]: e["value"] for e in vectors[1]}
    assert status == 200 and alone.keys() == batched.keys() and len(filled) == 5
    assert max(abs(alone[k] - batched[k]) for k in alone) < 1e-5
    for text, vector in zip(texts, vectors):
        ids = torch.tensor([tokenizer.encode(text)])
        with torch.no_grad():  # SPLADE from the full (T, V) logits
            weights = torch.log1p(torch.relu(model(ids, torch.ones_like(ids)).logits[0])).max(0).values
        want = {int(i): float(weights[i]) for i in weights.nonzero()[:, 0]}
        got = {entry["index"]: entry["value"] for entry in vector}
        assert got.keys() == want.keys() and max(abs(got[k] - want[k]) for k in want) < 1e-5
        assert [entry["value"] for entry in vector] == sorted(got.values(), reverse=True)
    done = subprocess.run([sys.executable, "-m", "unmask.cli", "serve", str(model_dirs["embed"]), "--pooling",
                           "splade"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--pooling splade needs a masked-LM directory" in done.stderr


def test_chunk_reads_long_inputs_in_windows_as_offline(model_dirs, server_class):
    from unmask.pipelines.embed import SentenceEncoder

    long = _long_text(300, 3)  # several windows of the context of 64
    encoder = SentenceEncoder.from_pretrained(model_dirs["embed"])
    server = server_class(model_dirs["embed"], "--truncation", "chunk", "--max_batch_tokens", "2048")
    try:
        status, vectors = server.call("POST", "/embed", {"inputs": [long, TEXT]})
        _, cut = server.call("POST", "/embed", {"inputs": [long], "truncate": True})
        status_all, error = server.call("POST", "/embed_all", {"inputs": long})
        too_long, message = server.call("POST", "/embed", {"inputs": _long_text(3000)})
    finally:
        server.stop()
    want = encoder.encode([long, TEXT], normalize=True, truncation="chunk")
    assert status == 200 and np.abs(np.array(vectors) - want).max() < 1e-5
    assert np.abs(np.array(cut) - want[:1]).max() > 1e-3  # cut is another answer: the windows were read
    assert status_all == 413 and "longer than the maximum of 64 tokens" in error["error"]  # no windows there
    assert too_long == 413 and "longer than the maximum of 2048 tokens" in message["error"]


def test_a_connection_that_never_finishes_its_request_is_closed(embed_server):
    """Bytes trickling in (slowloris) no longer hold a connection: the request head has a deadline."""
    import socket

    from unmask.serve import server as served

    with socket.create_connection(("127.0.0.1", embed_server.port), timeout=30) as slow:
        slow.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\n")
        started = time.perf_counter()
        closed = False
        while time.perf_counter() - started < served.HEAD_TIMEOUT + 10:
            try:
                slow.sendall(b"X")  # one byte a second, never the blank line that ends the head
                slow.settimeout(1.0)
                if slow.recv(1024) == b"":
                    closed = True
                    break
            except socket.timeout:
                continue
            except OSError:
                closed = True
                break
    assert closed and time.perf_counter() - started < served.HEAD_TIMEOUT + 5
    assert embed_server.call("GET", "/health")[0] == 200


def test_hugging_face_parameters_are_honoured_or_refused(model_dirs, server_class):
    from unmask.pipelines.classify import sigmoid

    server = server_class(model_dirs["classify"])
    try:
        _, raw = server.call("POST", "/predict", {"inputs": TEXT, "raw_scores": True})
        _, squashed = server.call("POST", "/", {"inputs": TEXT, "parameters": {"function_to_apply": "sigmoid"}})
        status, error = server.call("POST", "/", {"inputs": TEXT, "parameters": {"function_to_apply": "tanh"}})
    finally:
        server.stop()
    logits = {r["label"]: r["score"] for r in raw}
    assert all(abs(r["score"] - sigmoid(np.array(logits[r["label"]]))) < 1e-6 for r in squashed[0])
    assert status == 422 and "function_to_apply" in error["error"]
    tagger = server_class(model_dirs["tag"])
    try:
        status, error = tagger.call("POST", "/", {"inputs": TEXT, "parameters": {"aggregation_strategy": "max"}})
        assert status == 422 and "aggregation_strategy" in error["error"]
        assert tagger.call("POST", "/", {"inputs": TEXT, "parameters": {"aggregation_strategy": "first"}})[0] == 200
    finally:
        tagger.stop()
