"""Continued pretraining: from every kind of directory people have, with nothing lost at a learning rate of 0; runs
that cannot silently go wrong (a reused output directory, a killed save, a damaged checkpoint, a full disk); the
warmup-stable-decay and masking-rate schedules."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from unmask.config import BertConfig
from unmask.data.pretraining import PackedDataset, build_token_cache
from unmask.errors import CheckpointError, TrainingError, UsageError
from unmask.hub import DERIVED_KEYS, read_weights
from unmask.models import from_pretrained
from unmask.models.bert import BertForMaskedLM, BertForSequenceClassification, BertModel
from unmask.tokenizer import Tokenizer
from unmask.train import checkpoint as checkpoints
from unmask.train.evaluate import evaluate_mlm
from unmask.train.optim import lr_factor, make_optimizer, set_learning_rate
from unmask.train.pretrain import PretrainArgs, masking_rate, pretrain

transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("continued")


def args_for(root, corpus_file, output_dir, **overrides) -> PretrainArgs:
    base = dict(train_file=[str(corpus_file)], output_dir=str(output_dir), max_seq_length=32,
                per_device_train_batch_size=8, learning_rate=0.0, warmup_steps=1, max_steps=2, logging_steps=1,
                cache_dir=str(root / "cache"), show_progress=False)
    return PretrainArgs(**{**base, **overrides})


def tiny_dirs(root, tokenizer, corpus_file) -> dict:
    """One directory of each kind `--model_name_or_path` accepts, all on the test tokenizer."""
    torch.manual_seed(0)
    ids = dict(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id)
    dirs = {}
    for name, model in [("unmask-mlm", BertForMaskedLM(BertConfig(**TINY, **ids))),
                        ("unmask-encoder", BertModel(BertConfig(**TINY, **ids))),
                        ("unmask-classifier", BertForSequenceClassification(BertConfig(**TINY, **ids)))]:
        dirs[name] = model.save_pretrained(root / name, tokenizer=tokenizer)
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**TINY, **ids))
    hf.save_pretrained(root / "hf-mlm")
    modern = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
        **TINY, **ids, cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id))
    modern.save_pretrained(root / "hf-modernbert-mlm")
    for name in ("hf-mlm", "hf-modernbert-mlm"):
        tokenizer.save_pretrained(root / name)
        dirs[name] = root / name
    config = root / "tiny.json"
    config.write_text(json.dumps({"model_type": "bert", **TINY}))
    electra = root / "unmask-electra"
    pretrain(args_for(root, corpus_file, electra, model_config=str(config), tokenizer=str(root / "unmask-mlm"),
                      objective="electra", learning_rate=1e-3))
    dirs["unmask-electra"] = electra
    return dirs


@pytest.fixture(scope="module")
def start_dirs(root, tokenizer, corpus_file, minilm_dir):
    dirs = tiny_dirs(root, tokenizer, corpus_file)
    dirs["sentence-transformers"] = minilm_dir
    return dirs


def kept_tensors(start_dir, saved_dir, dropped_heads: tuple[str, ...] = ()) -> int:
    """Every tensor of the start directory that the saved model has a place for is there bit for bit (a bare
    encoder's `embeddings.x` is the MLM model's `bert.embeddings.x`, and the reverse); returns how many were
    compared. Heads the saved model has no place for (a classifier, a pooler, `dropped_heads`) are skipped."""
    start = read_weights(start_dir)
    saved = load_file(str(saved_dir / "model.safetensors"))
    compared = 0
    for key, tensor in start.items():
        names = [key, f"bert.{key}", f"model.{key}", key.removeprefix("bert."), key.removeprefix("model.")]
        match = next((name for name in names if name in saved), None)
        if match is None:
            derived = key.endswith(DERIVED_KEYS)  # buffers old checkpoints saved, rebuilt on load
            head = any(part in key for part in ("pooler", "classifier", "decoder")) or key.startswith(dropped_heads)
            assert derived or head, f"{key} was dropped"
            continue
        assert torch.equal(saved[match], tensor), key
        compared += 1
    return compared


def mlm_eval(model_dir, tokenizer, corpus_file, cache) -> dict:
    model = from_pretrained(model_dir, "masked-lm")
    data = PackedDataset.from_cache(build_token_cache([corpus_file], tokenizer, cache, show_progress=False),
                                    tokenizer, 32)
    return evaluate_mlm(model, data, tokenizer, batch_size=16, max_samples=48)


@pytest.mark.parametrize("kind", ["unmask-mlm", "hf-mlm", "hf-modernbert-mlm", "unmask-encoder", "unmask-classifier",
                                  "unmask-electra", "sentence-transformers"])
def test_learning_rate_zero_keeps_every_tensor_of_every_kind_of_directory(kind, start_dirs, root, corpus_file,
                                                                           capfd):
    start = start_dirs[kind]
    out = root / f"continued-{kind}"
    pretrain(args_for(root, corpus_file, out, model_name_or_path=str(start)))
    message = capfd.readouterr().err
    assert f"starting from {start}" in message and "created new:" in message
    encoder_tensors = [k for k in read_weights(start) if "pooler" not in k and "classifier" not in k
                       and not k.startswith(("cls.", "head.", "decoder.")) and not k.endswith(DERIVED_KEYS)]
    assert kept_tensors(start, out) >= len(encoder_tensors)
    saved = load_file(str(out / "model.safetensors"))
    assert not any(k.endswith("decoder.weight") for k in saved), "the decoder is tied to the word embeddings"
    tokenizer = Tokenizer.from_pretrained(start)
    after = mlm_eval(out, tokenizer, corpus_file, root / "cache")
    if kind.endswith("mlm"):  # its MLM head was kept: the same loss before and after
        assert "nothing" in message
        assert after == mlm_eval(start, tokenizer, corpus_file, root / "cache")
    else:
        assert "the MLM head" in message and after["tokens"] > 0


def test_electra_continues_from_a_directory_with_a_new_generator(start_dirs, root, corpus_file, capfd):
    start = start_dirs["unmask-mlm"]
    out = root / "continued-electra"
    pretrain(args_for(root, corpus_file, out, model_name_or_path=str(start), objective="electra"))
    assert "a generator and a replaced-token detection head" in capfd.readouterr().err
    assert kept_tensors(start, out, dropped_heads=("cls.",)) >= 20  # the whole encoder, as the discriminator
    assert (out / "electra.safetensors").exists()


def test_a_run_that_started_from_a_checkpoint_resumes_exactly(start_dirs, root, corpus_file):
    start = str(start_dirs["unmask-mlm"])
    settings = dict(model_name_or_path=start, learning_rate=1e-3, max_steps=6, save_steps=3)
    pretrain(args_for(root, corpus_file, root / "straight", **settings))
    resumed = root / "resumed"
    pretrain(args_for(root, corpus_file, resumed, **settings))
    (resumed / "model.safetensors").unlink()
    pretrain(args_for(root, corpus_file, resumed, **settings, resume_from_checkpoint=str(resumed / "checkpoint-3")))
    straight = load_file(str(root / "straight" / "model.safetensors"))
    again = load_file(str(resumed / "model.safetensors"))
    assert straight.keys() == again.keys() and all(torch.equal(straight[k], again[k]) for k in straight)


def test_bad_starting_points_are_clear_errors(start_dirs, root, corpus_file, tmp_path, tokenizer_dir):
    with pytest.raises(UsageError, match="exclude each other"):
        args_for(root, corpus_file, tmp_path / "a", model_name_or_path=str(start_dirs["unmask-mlm"]),
                 model_config="bert-tiny")
    for flag, value in (("vocab_size", 1000), ("position_init", "normal")):
        with pytest.raises(UsageError, match=f"--{flag} describes a new model"):
            args_for(root, corpus_file, tmp_path / "a", model_name_or_path=str(start_dirs["unmask-mlm"]),
                     **{flag: value})
    with pytest.raises(CheckpointError, match="config.json: missing"):
        pretrain(args_for(root, corpus_file, tmp_path / "b", model_name_or_path=str(tokenizer_dir)))
    small = BertForMaskedLM(BertConfig(**TINY, vocab_size=100)).save_pretrained(tmp_path / "small")
    shutil.copy(tokenizer_dir / "tokenizer.json", small)  # 300 tokens for a 100-row embedding
    with pytest.raises(CheckpointError, match="300 tokens but the model's embedding has 100 rows"):
        pretrain(args_for(root, corpus_file, tmp_path / "c", model_name_or_path=str(small)))
    with pytest.raises(UsageError, match="vocabulary differs"):
        pretrain(args_for(root, corpus_file, tmp_path / "d", model_name_or_path=str(start_dirs["unmask-mlm"]),
                          tokenizer=str(start_dirs["sentence-transformers"])))


def test_a_reused_output_directory_is_refused_or_replaced_never_mixed(start_dirs, root, corpus_file, tmp_path):
    out = tmp_path / "run"
    settings = dict(model_name_or_path=str(start_dirs["unmask-mlm"]), learning_rate=1e-3, save_steps=1,
                    save_total_limit=10)
    pretrain(args_for(root, corpus_file, out, **settings, seed=1, max_steps=4))
    first = load_file(str(out / "model.safetensors"))
    with pytest.raises(UsageError, match="is not empty .*--overwrite_output_dir"):
        pretrain(args_for(root, corpus_file, out, **settings, seed=2, max_steps=2))
    pretrain(args_for(root, corpus_file, out, **settings, seed=2, max_steps=2, overwrite_output_dir=True))
    assert [c.name for c in checkpoints.list_checkpoints(out)] == ["checkpoint-1", "checkpoint-2"]
    second = load_file(str(out / "model.safetensors"))
    assert not torch.equal(first["bert.embeddings.word_embeddings.weight"],
                           second["bert.embeddings.word_embeddings.weight"])
    assert json.loads((out / "pretrain_args.json").read_text())["seed"] == 2


def test_killed_saves_damaged_checkpoints_and_torn_metrics_are_survived(start_dirs, root, corpus_file, tmp_path):
    out = tmp_path / "run"
    settings = dict(model_name_or_path=str(start_dirs["unmask-mlm"]), learning_rate=1e-3, save_steps=2,
                    save_total_limit=5)
    pretrain(args_for(root, corpus_file, out, **settings, max_steps=4))
    (out / "checkpoint-6.tmp4242").mkdir()  # a save killed mid-way
    (out / ".metrics.jsonl.tmp4242").write_text("half")
    (out / "checkpoint-4" / "training_state.pt").write_bytes(b"")  # the newest is damaged
    with pytest.raises(CheckpointError, match=r"empty \(0 bytes\)"):
        checkpoints.load_training_state(out / "checkpoint-4")
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')  # a torn last line
    with pytest.warns(UserWarning) as caught:
        pretrain(args_for(root, corpus_file, out, **settings, max_steps=6, resume_from_checkpoint="latest"))
    said = " ".join(str(w.message) for w in caught)
    assert "checkpoint-4 cannot be resumed from" in said and "empty (0 bytes)" in said and "torn last line" in said
    assert not (out / "checkpoint-6.tmp4242").exists() and not (out / ".metrics.jsonl.tmp4242").exists()
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # resumed from step 2: its later lines dropped, the torn one too


def test_a_full_disk_says_so_and_keeps_the_previous_checkpoint(start_dirs, root, corpus_file, tmp_path,
                                                               monkeypatch):
    out = tmp_path / "run"
    settings = dict(model_name_or_path=str(start_dirs["unmask-mlm"]), learning_rate=1e-3, save_steps=2, max_steps=4)
    real_save = torch.save

    def save(obj, path, *a, **k):  # the second checkpoint's state hits a full disk, as torch reports it
        if "checkpoint-4" in str(path):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 832 vs 704")
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(TrainingError, match="no space left on device writing checkpoint-4.*checkpoint-2 is intact"):
        pretrain(args_for(root, corpus_file, out, **settings))
    assert [c.name for c in checkpoints.list_checkpoints(out)] == ["checkpoint-2"]
    assert not list(out.glob("checkpoint-4*"))


def test_warmup_stable_decay_and_the_masking_rate_schedule(root, corpus_file, tmp_path):
    factors = [lr_factor(step, 10, (step - 10) / 90, "warmup_stable_decay", 0.2) for step in range(100)]
    assert factors[4] == 0.5 and factors[9] == 1.0  # warmup
    assert all(f == 1.0 for f in factors[10:82])  # stable until the last 20% of the post-warmup steps
    assert factors[-1] < 0.06 and all(a > b for a, b in zip(factors[82:], factors[83:]))  # linear to 0
    with pytest.raises(UsageError, match="decay_ratio"):
        args_for(root, corpus_file, tmp_path, model_config="bert-tiny", decay_ratio=1.5)
    args = args_for(root, corpus_file, tmp_path, model_config="bert-tiny", max_steps=101, mlm_probability=0.3,
                    final_mlm_probability=0.15)
    assert masking_rate(args, 0) == 0.3 and masking_rate(args, 100) == pytest.approx(0.15)
    assert masking_rate(args, 50) == pytest.approx(0.225)


def test_the_command_line_refuses_a_model_config_with_a_directory(start_dirs, corpus_file, tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "unmask", "pretrain", "--train_file", str(corpus_file),
                           "--output_dir", str(tmp_path / "run"), "--model_config", "bert-tiny",
                           "--model_name_or_path", str(start_dirs["unmask-mlm"])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--model_config and --model_name_or_path exclude each other" in done.stderr


def test_head_learning_rate_moves_the_new_head_not_the_encoder(start_dirs, root, corpus_file):
    """From an encoder directory (its MLM head is new, made alike from the seed): three steps at --learning_rate
    1e-7 with and without --head_learning_rate 1e-2. Adam moves each element by about the rate a step, so the head
    parts by ~1e-2 and the encoder (the tied decoder included) stays within ~1e-7."""
    saved = {}
    for name, head_rate in (("head-lr", 1e-2), ("no-head-lr", None)):
        pretrain(args_for(root, corpus_file, root / name, model_name_or_path=str(start_dirs["unmask-encoder"]),
                          learning_rate=1e-7, head_learning_rate=head_rate, max_steps=3, warmup_steps=1))
        saved[name] = load_file(str(root / name / "model.safetensors"))
    moved = {k: float((saved["head-lr"][k] - saved["no-head-lr"][k]).abs().max()) for k in saved["head-lr"]}
    assert max(v for k, v in moved.items() if k.startswith("bert.")) < 1e-6
    assert moved["cls.predictions.transform.dense.weight"] > 5e-3 and moved["cls.predictions.bias"] > 5e-3


def test_head_learning_rate_groups():
    model = BertForMaskedLM(BertConfig(**TINY, vocab_size=100, pad_token_id=0))
    optimizer = make_optimizer(model, 1e-4, head_lr_scale=10.0)
    set_learning_rate(optimizer, 2e-5)
    names = {id(p): n for n, p in model.named_parameters()}
    rates = {names[id(p)]: group["lr"] for group in optimizer.param_groups for p in group["params"]}
    assert rates["cls.predictions.transform.dense.weight"] == rates["cls.predictions.bias"] == pytest.approx(2e-4)
    assert rates["bert.embeddings.word_embeddings.weight"] == 2e-5  # the tied decoder: an encoder parameter
    assert all(rate == 2e-5 for name, rate in rates.items() if name.startswith("bert."))
    assert len(rates) == len(names)  # every parameter in one group
