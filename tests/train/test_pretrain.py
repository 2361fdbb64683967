"""Pretraining end to end on a small corpus: metrics, exports, resume after SIGKILL, NaN, data parallel."""

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
               "intermediate_size": 64, "max_position_embeddings": 64}


@pytest.fixture(scope="module")
def setup(tmp_path_factory, corpus_file, tokenizer_dir):
    root = tmp_path_factory.mktemp("pretrain")
    config = root / "config.json"
    config.write_text(json.dumps(TINY_CONFIG))
    return {"root": root, "config": str(config), "train": str(corpus_file), "tokenizer": str(tokenizer_dir)}


def args_for(setup, output_dir, **overrides) -> PretrainArgs:
    base = dict(train_file=[setup["train"]], validation_file=[setup["train"]], output_dir=str(output_dir),
                model_config=setup["config"], tokenizer=setup["tokenizer"], max_seq_length=32,
                per_device_train_batch_size=8, learning_rate=1e-3, warmup_steps=5, max_steps=40, logging_steps=10,
                eval_steps=20, max_eval_samples=64, cache_dir=str(setup["root"] / "cache"), show_progress=False)
    return PretrainArgs(**{**base, **overrides})


def test_pretrain_learns_logs_and_exports(setup, capsys):
    transformers = pytest.importorskip("transformers")
    out = setup["root"] / "run"
    result = pretrain(args_for(setup, out, max_steps=60, learning_rate=5e-3))
    said = capsys.readouterr().err  # evaluations and the export are said, not only written to metrics.jsonl
    assert said.count("eval_loss") == 3 and f"step 60: eval_loss {result['eval_loss']:.4f}" in said
    assert f"saved the model of step 60 to {out}" in said
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == [10, 20, 30, 40, 50, 60]
    for r in train_rows:
        assert {"step", "loss", "learning_rate", "tokens_per_second"} <= set(r) and r["tokens_per_second"] > 0
    assert train_rows[-1]["loss"] < train_rows[0]["loss"] - 0.5  # it learns (uniform guessing is ln 300 = 5.7)
    assert {"eval_loss", "eval_accuracy", "eval_perplexity"} <= set(result)
    assert abs(result["eval_perplexity"] - torch.tensor(result["eval_loss"]).exp().item()) < 1e-3
    assert (out / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert not (out / "training_state.pt").exists(), "resume state never goes into the exported model"
    hf = transformers.AutoModelForMaskedLM.from_pretrained(str(out))
    ours = load_file(str(out / "model.safetensors"))
    assert torch.equal(hf.state_dict()["bert.embeddings.word_embeddings.weight"],
                       ours["bert.embeddings.word_embeddings.weight"])


def test_same_seed_same_weights_and_whole_word_mode(setup):
    a = setup["root"] / "a"
    b = setup["root"] / "b"
    pretrain(args_for(setup, a, max_steps=8, validation_file=[], whole_word_mask=True))
    pretrain(args_for(setup, b, max_steps=8, validation_file=[], whole_word_mask=True))
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def _cli(setup, output_dir, *extra):
    return [sys.executable, "-m", "unmask.cli", "pretrain", "--train_file", setup["train"], "--output_dir",
            str(output_dir), "--model_config", setup["config"], "--tokenizer", setup["tokenizer"],
            "--max_seq_length", "32", "--per_device_train_batch_size", "8", "--learning_rate", "1e-3",
            "--warmup_steps", "5", "--max_steps", "30", "--save_steps", "3", "--logging_steps", "3",
            "--cache_dir", str(setup["root"] / "cache"), "--no_show_progress", *extra]


def test_resume_after_sigkill_gives_identical_weights(setup):
    reference = setup["root"] / "uninterrupted"
    subprocess.run(_cli(setup, reference), check=True, capture_output=True, timeout=300)
    killed = setup["root"] / "killed"
    kill_when_saved(_cli(setup, killed), killed / "checkpoint-9")
    resumed = subprocess.run(_cli(setup, killed, "--resume_from_checkpoint", "latest"), capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    a, b = load_file(str(reference / "model.safetensors")), load_file(str(killed / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(line)["step"] for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 30 and len(steps) == len(set(steps))


def test_nan_loss_stops_with_a_clear_error(setup):
    with pytest.raises(TrainingError, match="loss is nan"):
        pretrain(args_for(setup, setup["root"] / "nan", learning_rate=1e30, warmup_steps=0, max_grad_norm=1e30,
                          max_steps=20, validation_file=[]))


def test_bad_arguments_are_refused(setup):
    with pytest.raises(ValueError, match="mlm_probability"):
        args_for(setup, setup["root"] / "x", mlm_probability=0.0)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        pretrain(args_for(setup, setup["root"] / "x", max_seq_length=100))
    with pytest.raises(ValueError, match="position_init"):
        args_for(setup, setup["root"] / "x", position_init="learned")


def test_positions_start_from_the_sinusoid_table_unless_told(setup):
    """One step at a negligible learning rate: the exported positions are still their initial values."""
    from unmask.models.bert import sinusoidal_table

    key = "bert.embeddings.position_embeddings.weight"
    tiny_step = dict(max_steps=1, warmup_steps=0, learning_rate=1e-12, validation_file=[])
    pretrain(args_for(setup, setup["root"] / "sin", **tiny_step))
    pretrain(args_for(setup, setup["root"] / "noise", position_init="normal", **tiny_step))
    sin = load_file(str(setup["root"] / "sin" / "model.safetensors"))[key]  # (64, 32)
    noise = load_file(str(setup["root"] / "noise" / "model.safetensors"))[key]
    expected = sinusoidal_table(64, 32) * 0.02 * 2 ** 0.5  # RMS: the config's initializer_range
    assert torch.allclose(sin, expected, atol=1e-6)
    assert abs(noise.std().item() - 0.02) < 0.002 and (noise - expected).abs().max() > 0.02


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_two_processes_match_one_with_the_same_global_batch(setup):
    one = setup["root"] / "ddp1"
    two = setup["root"] / "ddp2"
    common = ["--max_steps", "6", "--save_steps", "0", "--logging_steps", "2"]
    no_dropout = setup["root"] / "no_dropout.json"  # dropout draws differ per rank by design
    no_dropout.write_text(json.dumps({**TINY_CONFIG, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}))
    common += ["--model_config", str(no_dropout)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd1 = _cli(setup, one, *common, "--per_device_train_batch_size", "8")
    subprocess.run(cmd1, check=True, capture_output=True, timeout=300, env=env)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
                "-m", "unmask.cli"]
    cmd2 = torchrun + _cli(setup, two, *common, "--per_device_train_batch_size", "4")[3:]
    done = subprocess.run(cmd2, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = load_file(str(one / "model.safetensors")), load_file(str(two / "model.safetensors"))
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < 1e-5, worst  # same update; only the order of floating-point sums differs


def test_gradient_accumulation_makes_the_same_update(setup):
    no_dropout = setup["root"] / "no_dropout_accum.json"
    no_dropout.write_text(json.dumps({**TINY_CONFIG, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}))
    one, two = setup["root"] / "accum1", setup["root"] / "accum2"
    common = dict(model_config=str(no_dropout), max_steps=5, validation_file=[])
    pretrain(args_for(setup, one, per_device_train_batch_size=8, **common))
    pretrain(args_for(setup, two, per_device_train_batch_size=4, gradient_accumulation_steps=2, **common))
    a, b = load_file(str(one / "model.safetensors")), load_file(str(two / "model.safetensors"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


@pytest.mark.slow  # a minute of compilation
@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="torch.compile on CPU needs a C compiler")
def test_torch_compile_makes_the_same_updates(setup, tmp_path, monkeypatch):
    """--torch_compile changes how the step runs, not what it computes (no dropout: the same function)."""
    # a private inductor cache: the shared one in /tmp can hold kernels built for another vector ISA (torch 2.13's
    # key misses ATEN_CPU_CAPABILITY), which summed each row twice here (a length of 64 for 32 real tokens)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    no_dropout = setup["root"] / "no_dropout_compile.json"
    no_dropout.write_text(json.dumps({**TINY_CONFIG, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}))
    eager, compiled = setup["root"] / "eager", setup["root"] / "compiled"
    common = dict(model_config=str(no_dropout), max_steps=4, validation_file=[])
    pretrain(args_for(setup, eager, **common))
    from torch._dynamo.utils import counters

    counters.clear()
    pretrain(args_for(setup, compiled, torch_compile=True, **common))
    assert counters["stats"]["unique_graphs"] >= 1  # it did compile
    a, b = load_file(str(eager / "model.safetensors")), load_file(str(compiled / "model.safetensors"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4


def test_bf16_autocast_trains_and_exports_fp32(setup):
    out = setup["root"] / "bf16"
    result = pretrain(args_for(setup, out, bf16=True, max_steps=20, learning_rate=5e-3))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert rows[-1]["loss"] < rows[0]["loss"] and result["eval_loss"] < 5.7
    assert all(t.dtype == torch.float32 for t in load_file(str(out / "model.safetensors")).values())


def test_modernbert_pretrains_and_loads_in_transformers(setup):
    transformers = pytest.importorskip("transformers")
    config = setup["root"] / "modern.json"
    config.write_text(json.dumps({"model_type": "modernbert", "hidden_size": 32, "num_hidden_layers": 3,
                                  "num_attention_heads": 2, "intermediate_size": 48, "local_attention": 8,
                                  "max_position_embeddings": 64}))
    out = setup["root"] / "modern"
    result = pretrain(args_for(setup, out, model_config=str(config), max_steps=40, learning_rate=5e-3))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5 and result["eval_accuracy"] > 0.05
    hf = transformers.AutoModelForMaskedLM.from_pretrained(str(out)).eval()
    assert type(hf).__name__ == "ModernBertForMaskedLM" and hf.config.pad_token_id == 0


def test_num_train_epochs_and_max_train_samples_as_transformers_reads_them(setup):
    """2 epochs over the first 24 packed sequences at 8 a step: 6 steps, and those 24 sequences only."""
    out = setup["root"] / "epochs"
    result = pretrain(args_for(setup, out, max_steps=None, num_train_epochs=2, max_train_samples=24, warmup_steps=1,
                               validation_file=[]))
    assert result["step"] == 6
    assert json.loads((out / "pretrain_args.json").read_text())["max_steps"] == 6
    with pytest.raises(UsageError, match="--num_train_epochs \\(above 0\\) and --max_steps exclude each other"):
        args_for(setup, out, num_train_epochs=1)
    with pytest.raises(UsageError, match="a stream has no length"):
        args_for(setup, out, max_steps=None, num_train_epochs=1, streaming=True)
