"""Seeded fuzzing: thousands of bodies, valid, broken and hostile, on every route; never a 5xx, never a dead server."""

from __future__ import annotations

import http.client
import json
import random

import pytest

pytest.importorskip("fastapi")

ROUTES = {"embed": ["/embed", "/embed_all", "/similarity", "/v1/embeddings", "/tokenize", "/decode", "/"],
          "classify": ["/predict", "/rerank", "/", "/tokenize"], "fill-mask": ["/fill-mask", "/"], "tag": ["/tag"]}
VALID = {"/embed": {"inputs": ["a b", "c"], "truncate": True}, "/embed_all": {"inputs": "a b"},
         "/similarity": {"inputs": {"source_sentence": "a", "sentences": ["b"]}},
         "/v1/embeddings": {"input": ["a"], "encoding_format": "base64", "dimensions": 8},
         "/tokenize": {"inputs": "naïve café"}, "/decode": {"ids": [2, 5, 3]}, "/": {"inputs": "the [MASK] sailor"},
         "/predict": {"inputs": [["a", "b"], ["c"]]}, "/rerank": {"query": "a", "texts": ["b", "c"]},
         "/fill-mask": {"inputs": "the [MASK] sailor", "top_k": 3}, "/tag": {"inputs": "our teacher"}}
STRINGS = ["", " ", "\x00", "\u200b", "\ufeff", "[MASK]", "[CLS]", "é" * 300, "東京" * 50, "a " * 400, "\n\t",
           "🙂", "\\ud800", "null", "0" * 50]


def _value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return rng.choice(STRINGS)
    if kind == 1:
        return rng.choice([0, -1, 1, 2**31, 2**63, 10**30, 299, 300])
    if kind == 2:
        return rng.choice([0.5, -1e308, 1e-320, 3.0])
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return "".join(rng.choice("ab [MASK]é東\u0301\x7f") for _ in range(rng.randrange(40)))
    if kind == 5:
        return [rng.randrange(-2, 400) for _ in range(rng.randrange(70))]
    if kind in (6, 7):
        return [_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    keys = ["inputs", "input", "texts", "query", "ids", "truncate", "top_k", "dimensions", "normalize",
            "truncation_direction", "prompt_name", "raw_scores", "parameters", "encoding_format", "sentences"]
    return {rng.choice(keys): _value(rng, depth + 1) for _ in range(rng.randrange(4))}


def _body(rng: random.Random, route: str) -> bytes:
    roll = rng.random()
    if roll < 0.4:  # a valid body with one field replaced
        body = dict(VALID[route])
        body[rng.choice([*body, "parameters", "truncation_direction"])] = _value(rng)
        return json.dumps(body).encode()
    if roll < 0.8:
        return json.dumps(_value(rng)).encode()
    raw = bytearray(json.dumps(VALID[route]).encode())  # bytes flipped, cut or repeated
    for _ in range(rng.randrange(1, 4)):
        raw[rng.randrange(len(raw))] = rng.randrange(256)
    return bytes(raw[: rng.randrange(1, len(raw) + 1)]) if rng.random() < 0.3 else bytes(raw)


@pytest.mark.parametrize("head", list(ROUTES))
def test_fuzzed_bodies_never_get_a_5xx(head, model_dirs, server_class):
    server = server_class(model_dirs[head], "--max_client_batch_size", "16")
    rng, statuses = random.Random(head), {}
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        for n in range(1200 if head == "embed" else 600):
            route = ROUTES[head][n % len(ROUTES[head])]
            body = _body(rng, route)
            connection.request("POST", route, body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            payload = response.read()
            statuses[response.status] = statuses.get(response.status, 0) + 1
            assert response.status < 500, (route, body[:300], payload[:300])
            if response.status >= 400:
                assert "error" in json.loads(payload)
            if response.getheader("connection", "").lower() == "close":
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        assert server.call("GET", "/health")[0] == 200
        assert statuses.get(200, 0) > 20 and sum(v for k, v in statuses.items() if k >= 400) > 100, statuses
    finally:
        server.stop()
