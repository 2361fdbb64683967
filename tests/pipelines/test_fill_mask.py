"""fill-mask: the transformers pipeline's output on the same directory, and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from unmask.config import BertConfig
from unmask.models.bert import BertForMaskedLM
from unmask.pipelines.fill_mask import fill_mask

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=24)
    path = tmp_path_factory.mktemp("fill_mask_model")
    BertForMaskedLM(config).save_pretrained(path, tokenizer=tokenizer)
    return path


def _same(ours, theirs):
    assert [c["token"] for c in ours] == [c["token"] for c in theirs]
    assert [c["token_str"] for c in ours] == [c["token_str"] for c in theirs]
    assert [c["sequence"] for c in ours] == [c["sequence"] for c in theirs]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(ours, theirs)) < 1e-5


def test_matches_the_transformers_pipeline(model_dir, tokenizer):
    pipe = transformers.pipeline("fill-mask", model=str(model_dir), top_k=4)
    model = BertForMaskedLM.from_pretrained(model_dir)
    one = "the old sailor [MASK] the lighthouse"
    two = "the [MASK] sailor carried [MASK] letter"
    _same(fill_mask(model, tokenizer, one, top_k=4), pipe(one))
    ours_two, theirs_two = fill_mask(model, tokenizer, two, top_k=4), pipe(two)
    assert len(ours_two) == len(theirs_two) == 2
    for a, b in zip(ours_two, theirs_two):
        _same(a, b)
    batch = fill_mask(model, tokenizer, [one, two, one], top_k=4, batch_size=2)
    _same(batch[0], pipe(one))
    _same(batch[2], pipe(one))
    # 33 masks in one batch: the model rounds its rows up to 34 (models.outputs.prediction_rows); the extra row
    # must not shift the answers
    many = fill_mask(model, tokenizer, [one] + [two] * 16, top_k=4, batch_size=17)
    _same(many[0], pipe(one))
    for a, b in zip(many[16], theirs_two):
        _same(a, b)


def test_clear_errors(model_dir, tokenizer):
    model = BertForMaskedLM.from_pretrained(model_dir)
    with pytest.raises(ValueError, match="empty text"):
        fill_mask(model, tokenizer, "   ")
    with pytest.raises(ValueError, match=r"no \[MASK\]"):
        fill_mask(model, tokenizer, "nothing to fill here")
    with pytest.raises(ValueError, match="longer than the model's context of 24"):
        fill_mask(model, tokenizer, "the sailor " * 20 + "[MASK]")


def test_command_line_json_and_errors(model_dir):
    run = lambda *a: subprocess.run([sys.executable, "-m", "unmask.cli", "fill-mask", str(model_dir), *a],  # noqa
                                    capture_output=True, text=True, timeout=120)
    done = run("the old sailor [MASK] the lighthouse", "--top_k", "3", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert len(result) == 3 and set(result[0]) == {"score", "token", "token_str", "sequence"}
    failed = run("no mask at all")
    assert failed.returncode == 2 and "no [MASK]" in failed.stderr and "Traceback" not in failed.stderr
