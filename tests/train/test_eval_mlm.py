"""`unmask eval mlm`: loss, accuracy, perplexity and token count, with a fixed masking seed."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import torch

from unmask.config import BertConfig
from unmask.models.bert import BertForMaskedLM


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
