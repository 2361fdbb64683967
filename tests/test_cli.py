"""The `unmask` command as a user runs it: a real subprocess, real exit codes."""

from __future__ import annotations

import subprocess
import sys

import pytest


def unmask(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "unmask.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_quickstart_runs_the_lesson_then_pretrains_and_fills_blanks(tmp_path):
    result = unmask("quickstart", "--output_dir", tmp_path / "qs")
    assert result.returncode == 0, result.stderr
    assert "both sides      1.000" in result.stdout and "1.1513" in result.stdout
    # every verb probe is decided by the right-hand context, and the model gets all three
    assert result.stdout.count("<- right") == 3 and "<- wrong" not in result.stdout
    assert (tmp_path / "qs" / "model" / "model.safetensors").exists()


def test_tokenizer_train_command(corpus_file, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "tok"
    result = unmask("tokenizer", "train", corpus_file, "--vocab_size", 200, "--min_frequency", 1,
                    "--output_dir", out)
    assert result.returncode == 0, result.stderr
    assert "200 tokens" in result.stdout
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    assert hf.vocab_size == 200 and hf.cls_token_id == 2


def test_bad_input_is_a_clear_error_not_a_traceback(tmp_path):
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"caf\xe9")
    result = unmask("tokenizer", "train", latin, "--vocab_size", 100, "--output_dir", tmp_path / "o")
    assert result.returncode == 2
    assert "not valid UTF-8" in result.stderr and "Traceback" not in result.stderr
    result = unmask("demo", "--mlm_probability", "1.5")
    assert result.returncode == 2 and "between 0 and 1" in result.stderr
