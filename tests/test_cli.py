"""The `unmask` command as a user runs it: a real subprocess, real exit codes."""

from __future__ import annotations

import json
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


def test_help_and_version_answer_without_torch():
    """`--help` builds every command's flags from torch-free argument modules: torch is never imported."""
    probe = ("import sys\nfrom unmask.cli import main\n"
             "for argv in (['--help'], ['pretrain', '--help'], ['finetune', '--help'], ['serve', '--help'], "
             "['--version']):\n"
             "    try:\n        main(argv)\n    except SystemExit as e:\n        assert e.code == 0, argv\n"
             "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("False")
    assert "unmask 0." in unmask("--version").stdout


@pytest.mark.parametrize("argv, message", [
    (["pretrain", "--learnig_rate", "1e-4", "--train_file", "x", "--output_dir", "y"],
     "unrecognized argument --learnig_rate; did you mean --learning_rate"),
    (["eval", "sts", "--modle", "m"], "unrecognized argument --modle; did you mean --model?"),  # before "required"
    (["embed", "m", "--input", "a", "--output", "b", "--zzz"], "unrecognized argument --zzz; see unmask embed --help"),
])
def test_an_unknown_flag_gets_the_command_usage_and_the_closest_flag(argv, message):
    result = unmask(*argv)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"usage: unmask {argv[0]}") and message in result.stderr


def test_a_closed_pipe_ends_quietly(model_dirs):
    """`unmask ... | head`: the reader leaves after one line of a large output; no BrokenPipeError traceback."""
    command = [sys.executable, "-m", "unmask.cli", "predict", "classify", "--model", str(model_dirs["classify"]),
               *["a short text to classify"] * 3000]  # ~150 KB of JSON: more than a pipe holds
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.read(10)
    process.stdout.close()
    stderr = process.communicate(timeout=300)[1].decode()
    assert process.returncode == 1 and "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_the_model_is_given_either_way_on_every_command(model_dirs):
    """Positional or --model / --model_name_or_path, the same answer; given twice or not at all, a clear error."""
    classifier = str(model_dirs["classify"])
    answers = [unmask("predict", "classify", *form, "a text", "another text")
               for form in ([classifier], ["--model", classifier], ["--model_name_or_path", classifier])]
    assert all(a.returncode == 0 for a in answers), [a.stderr for a in answers]
    assert answers[0].stdout == answers[1].stdout == answers[2].stdout
    assert len(json.loads(answers[1].stdout)) == 2  # both texts scored: the flag's positional is a text
    missing = unmask("eval", "sts", "--file", "x.tsv")
    assert missing.returncode == 2 and "required: MODEL (a model directory, or --model MODEL)" in missing.stderr
    twice = unmask("eval", "sts", classifier, "--model", classifier, "--file", "x.tsv")
    assert twice.returncode == 2 and "the model is given twice" in twice.stderr


def test_switches_are_spelled_with_underscores():
    result = unmask("tokenizer", "train", "--help")
    assert "--no_lowercase" in result.stdout and "--no-lowercase" not in result.stdout
    assert unmask("pretrain", "--no-show_progress", "--train_file", "x", "--output_dir", "y").returncode == 2


@pytest.mark.parametrize("argv, holds", [
    (["predict", "classify", "{fill-mask}", "a text"], "holds a masked-LM (BertForMaskedLM)"),
    (["predict", "tag", "{classify}", "a text"], "holds a sequence classifier (BertForSequenceClassification)"),
    (["predict", "rerank", "{embed}", "a query", "a text"], "holds an encoder without a task head (BertModel)"),
    (["fill-mask", "{embed}", "a [MASK] text"], "holds an encoder without a task head"),
    (["eval", "mlm", "{classify}", "--file", "x.txt"], "holds a sequence classifier"),
    (["eval", "tag", "{classify}", "--file", "x.conll"], "holds a sequence classifier"),
])
def test_the_wrong_kind_of_model_is_named_with_what_fits_it(argv, holds, model_dirs):
    """Never a traceback and never a head made up from random weights: what the directory holds and what fits."""
    argv = [a.format(**{k: str(v) for k, v in model_dirs.items()}) if a.startswith("{") else a for a in argv]
    result = unmask(*argv)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert holds in result.stderr and "that directory fits: unmask" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_transformers_flag_names_and_flags_given_twice(tmp_path):
    aliased = unmask("pretrain", "--config_name", "bert-tiny", "--tokenizer_name", tmp_path / "none",
                     "--train_file", "x", "--output_dir", tmp_path / "o")
    assert aliased.returncode == 2 and "tokenizer directory not found" in aliased.stderr  # read as --tokenizer
    twice = unmask("finetune", "classify", "m", "--train_file", "a.tsv", "--train_file", "b.tsv", "--output_dir", "o")
    assert twice.returncode == 2 and "--train_file is given twice: it takes one value" in twice.stderr


def test_every_flag_of_every_command_has_help():
    import argparse

    from unmask.cli import build_parser

    missing = []

    def walk(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(choice.help for choice in action._choices_actions), name  # listed with a line each
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}")
            elif action.dest != "help" and len((action.help or "").split("(default")[0].strip()) < 10:
                missing.append(f"{name} {action.option_strings or action.dest}")

    walk(build_parser(), "unmask")
    assert not missing
