"""The served models (tiny, on the test tokenizer) and a real `unmask serve` process on a free loopback port."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from unmask.config import BertConfig
from unmask.models.bert import (
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)


def config(tokenizer, **extra) -> BertConfig:
    return BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, **extra)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tokenizer):
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("served")
    labels = {0: "neg", 1: "pos"}
    tags = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
    made = {"embed": BertModel(config(tokenizer)),
            "classify": BertForSequenceClassification(config(tokenizer, id2label=labels, num_labels=2)),
            "fill-mask": BertForMaskedLM(config(tokenizer)),
            "tag": BertForTokenClassification(config(tokenizer, id2label=tags, num_labels=5))}
    for name, model in made.items():
        model.save_pretrained(root / name, tokenizer=tokenizer)
    return {name: root / name for name in made}


class Server:
    """`unmask serve MODEL_DIR FLAGS...` until `stop`; `call` speaks HTTP/1.1 to it."""

    def __init__(self, model_dir, *flags: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen([sys.executable, "-m", "unmask.cli", "serve", str(model_dir), "--port",
                                      str(self.port), "--log_level", "warning", *flags],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 90
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.proc.stderr.read()}")
            try:
                if self.call("GET", "/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the server did not come up in 90 s")

    def call(self, method: str, path: str, body=None, raw: bytes | None = None, headers: dict | None = None):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        connection.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        payload = response.read().decode()
        connection.close()
        kind = response.getheader("content-type") or ""
        return response.status, json.loads(payload) if "json" in kind else payload

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)



@pytest.fixture(scope="session")
def server_class():
    return Server
