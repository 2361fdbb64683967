"""`pretrain --streaming` end to end: it learns, a SIGKILLed run resumes to the same weights, two processes stream
their own documents and resume exactly, and the position is refused where it does not belong."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import kill_when_saved
from unmask.errors import TrainingError, UsageError
from unmask.train.pretrain import PretrainArgs, pretrain

TINY_CONFIG = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
               "intermediate_size": 64, "max_position_embeddings": 64, "hidden_dropout_prob": 0.0,
               "attention_probs_dropout_prob": 0.0}


@pytest.fixture(scope="module")
def setup(tmp_path_factory, corpus_lines, tokenizer_dir):
    root = tmp_path_factory.mktemp("streaming")
    (root / "config.json").write_text(json.dumps(TINY_CONFIG))
    # with dropout, each rank's draws are its own: resuming restores every rank's generators
    (root / "dropout.json").write_text(json.dumps({**TINY_CONFIG, "hidden_dropout_prob": 0.1}))
    shards = []
    for s in range(3):  # three JSONL shards of short documents
        shard = root / f"shard-{s}.jsonl"
        lines = corpus_lines[s * 130 : (s + 1) * 130]
        shard.write_text("".join(json.dumps({"text": " ".join(lines[i : i + 2])}) + "\n" for i in range(0, 130, 2)))
        shards.append(shard)
    return {"root": root, "config": str(root / "config.json"), "glob": str(root / "shard-*.jsonl"),
            "tokenizer": str(tokenizer_dir)}


def _cli(setup, output_dir, *extra):
    return [sys.executable, "-m", "unmask.cli", "pretrain", "--train_file", setup["glob"], "--output_dir",
            str(output_dir), "--model_config", setup["config"], "--tokenizer", setup["tokenizer"],
            "--max_seq_length", "32", "--per_device_train_batch_size", "8", "--learning_rate", "1e-3",
            "--warmup_steps", "5", "--max_steps", "30", "--save_steps", "3", "--logging_steps", "3",
            "--streaming", "--shuffle_buffer_size", "64", "--dataloader_num_workers", "1", "--no_show_progress",
            *extra]


def _same_weights(a_dir, b_dir) -> bool:
    a, b = load_file(str(a_dir / "model.safetensors")), load_file(str(b_dir / "model.safetensors"))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_streamed_run_learns(setup):
    out = setup["root"] / "learns"
    pretrain(PretrainArgs(train_file=[setup["glob"]], output_dir=str(out), model_config=setup["config"],
                          tokenizer=setup["tokenizer"], max_seq_length=32, per_device_train_batch_size=8,
                          learning_rate=5e-3, warmup_steps=5, max_steps=60, logging_steps=10, streaming=True,
                          shuffle_buffer_size=200, show_progress=False))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5  # uniform guessing over 300 pieces is 5.7


def test_a_killed_streamed_run_resumes_to_the_same_weights(setup):
    dropout = ("--model_config", str(setup["root"] / "dropout.json"))
    reference = setup["root"] / "uninterrupted"
    subprocess.run(_cli(setup, reference, *dropout), check=True, capture_output=True, timeout=300)
    killed = setup["root"] / "killed"
    kill_when_saved(_cli(setup, killed, *dropout), killed / "checkpoint-12")
    resumed = subprocess.run(_cli(setup, killed, *dropout, "--resume_from_checkpoint", "latest",
                                  "--dataloader_num_workers", "2"),  # any number of workers reads the same stream
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert _same_weights(reference, killed)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_two_streaming_processes_resume_exactly(setup):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29541",
                "-m", "unmask.cli"]
    straight, resumed = setup["root"] / "ddp-straight", setup["root"] / "ddp-resumed"
    common = ["--max_steps", "8", "--save_steps", "4", "--per_device_train_batch_size", "4",
              "--model_config", str(setup["root"] / "dropout.json")]
    for out in (straight, resumed):
        done = subprocess.run(torchrun + _cli(setup, out, *common)[3:], capture_output=True, text=True, timeout=300,
                              env=env)
        assert done.returncode == 0, done.stderr[-3000:]
    assert _same_weights(straight, resumed)
    state = torch.load(resumed / "checkpoint-4" / "training_state.pt", weights_only=True)
    assert len(state["streams"]) == 2 and state["streams"][0]["after"] != state["streams"][1]["after"]
    masking = [rank["generators"][0] for rank in state["random"]]  # each rank masks its rows with its own draws
    assert len(masking) == 2 and not torch.equal(masking[0], masking[1])
    for leftover in ("checkpoint-8", "model.safetensors"):  # back to step 4, then on to 8 again
        path = resumed / leftover
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    again = subprocess.run(torchrun + _cli(setup, resumed, *common, "--resume_from_checkpoint",
                                           str(resumed / "checkpoint-4"))[3:],
                           capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _same_weights(straight, resumed)
    one = subprocess.run(_cli(setup, resumed, *common, "--resume_from_checkpoint", str(resumed / "checkpoint-4")),
                         capture_output=True, text=True, timeout=300, env=env)
    assert one.returncode == 2 and "saved by 2 streaming processes: resume with as many" in one.stderr


def test_a_position_is_refused_where_it_does_not_belong(setup):
    cached = setup["root"] / "cached"
    pretrain(PretrainArgs(train_file=[setup["glob"]], output_dir=str(cached), model_config=setup["config"],
                          tokenizer=setup["tokenizer"], max_seq_length=32, max_steps=2, save_steps=2,
                          cache_dir=str(setup["root"] / "cache"), show_progress=False))
    streamed = PretrainArgs(train_file=[setup["glob"]], output_dir=str(cached), model_config=setup["config"],
                            tokenizer=setup["tokenizer"], max_seq_length=32, max_steps=4, streaming=True,
                            resume_from_checkpoint="latest", show_progress=False)
    with pytest.raises(TrainingError, match="holds no stream position"):
        pretrain(streamed)
    with pytest.raises(UsageError, match="--skip_bad_files applies to --streaming"):
        PretrainArgs(train_file=[setup["glob"]], output_dir=str(cached), skip_bad_files=True)
