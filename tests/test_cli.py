"""The `unmask` command as a user runs it: a real subprocess, real exit codes."""

from __future__ import annotations

import json
import re
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


def _mistakes(root, dirs) -> dict[str, tuple[list, str]]:
    """Newcomer mistakes: the command line, and what its one-line error must say (the file, and the fix)."""
    (root / "empty.txt").write_text("")
    (root / "sst2.tsv").write_text("sentence\tlabel\nhide new secretions \t0\nit is good \t1\n")
    (root / "scores.tsv").write_text("sentence\tscore\nhide new secretions \t0\n")
    (root / "latin.txt").write_bytes(b"caf\xe9\n")
    (root / "not-a-model").mkdir()
    (root / "sts.tsv").write_text("a\tb\tgold\nx\ty\t1\n")
    (root / "sts-tabs.csv").write_text("a\tb\tgold\nx\ty\t1\n")
    (root / "used").mkdir()
    (root / "used" / "metrics.jsonl").write_text("{}\n")
    text, encoder, classifier, mlm = root / "sst2.tsv", dirs["embed"], dirs["classify"], dirs["fill-mask"]
    pretrain = ["pretrain", "--train_file", text, "--output_dir", root / "run"]
    embed = ["embed", encoder, "--input", text, "--output", root / "v.npy"]
    return {
        "a model directory that is not there": (["predict", "classify", root / "nope", "a"], "nope: model directory "
                                                                                               "not found"),
        "a directory without config.json": (embed[:1] + [root / "not-a-model"] + embed[2:], "config.json: missing"),
        "serving a directory that is not a model": (["serve", root / "not-a-model"], "not a model directory"),
        "classify with a masked-LM": (["predict", "classify", mlm, "a"], "needs a sequence classifier"),
        "tag with a sentence classifier": (["predict", "tag", classifier, "a"], "needs a token classifier"),
        "rerank with an encoder": (["predict", "rerank", encoder, "q", "d"], "that directory fits: unmask embed"),
        "fill-mask without an MLM head": (["fill-mask", encoder, "a [MASK]"], "needs a masked-LM"),
        "eval mlm without an MLM head": (["eval", "mlm", encoder, "--file", text], "needs a masked-LM"),
        "an empty training file": (pretrain[:2] + [root / "empty.txt"] + pretrain[3:], "empty.txt: no text"),
        "an empty labelled file": (["finetune", "classify", encoder, "--train_file", root / "empty.txt",
                                    "--output_dir", root / "ft"], "empty.txt: no examples"),
        "a missing label column": (["finetune", "classify", encoder, "--train_file", root / "scores.tsv",
                                    "--output_dir", root / "ft"], "no column 'label' (columns: sentence, score)"),
        "a sentence table given to the tagger": (["finetune", "tag", encoder, "--train_file", text, "--output_dir",
                                                  root / "ft"], "a CoNLL file has one token per line"),
        "a TSV named .csv": (["eval", "sts", encoder, "--file", root / "sts-tabs.csv", "--sentence1_column", "a"],
                             "read as comma-separated (by its name)"),
        "an STS column that is not there": (["eval", "sts", encoder, "--file", root / "sts.tsv",
                                             "--sentence1_column", "a"], "no column 'sentence2' (columns: a, b, gold)"),
        "a preset and a checkpoint": (pretrain + ["--model_config", "bert-tiny", "--model_name_or_path", mlm],
                                      "--model_config and --model_name_or_path exclude each other"),
        "an output directory in use": (pretrain[:4] + [root / "used"], "pass --overwrite_output_dir"),
        "a fine-tuning output directory in use": (["finetune", "classify", encoder, "--train_file", text,
                                                  "--output_dir", root / "used"], "pass --overwrite_output_dir"),
        "sequences longer than the model's context": (pretrain + ["--model_name_or_path", mlm, "--max_seq_length",
                                                                  "4096"], "exceeds the model's"),
        "resuming with no checkpoint": (pretrain + ["--resume_from_checkpoint", "latest"], "no complete checkpoint"),
        "--skip_bad_files without --streaming": (pretrain + ["--skip_bad_files"], "applies to --streaming"),
        "a typo'd flag": (pretrain + ["--learnig_rate", "1e-4"], "did you mean --learning_rate"),
        "a misspelt command": (["evl", "sts"], "did you mean eval?"),
        "a misspelt task": (["finetune", "clasify", encoder], "did you mean classify?"),
        "a typo'd scheduler": (pretrain + ["--lr_scheduler_type", "cosin"], "--lr_scheduler_type must be one of"),
        "a negative learning rate": (pretrain + ["--learning_rate", "-1"], "--learning_rate cannot be negative"),
        "an input file that is not there": (embed[:3] + [root / "nope.txt"] + embed[4:], "nope.txt: no such file"),
        "a Latin-1 input file": (embed[:3] + [root / "latin.txt"] + embed[4:], "not valid UTF-8"),
        "a glob that matches nothing": (["tokenizer", "train", root / "nothing*.txt", "--output_dir", root / "tok"],
                                        "no file matches this pattern"),
        "a training file given twice": (["finetune", "classify", encoder, "--train_file", text, "--train_file", text,
                                         "--output_dir", root / "ft"], "--train_file is given twice"),
        "the model given twice": (["eval", "sts", encoder, "--model", encoder, "--file", text], "given twice"),
        "int8 and bf16 at once": (embed + ["--int8", "--bf16"], "not allowed with argument --int8"),
        "a port that is not a number": (["serve", encoder, "--port", "http"], "invalid int value: 'http'"),
        "the sample written over a folder in use": (["example-data", root / "used"], "used is not empty"),
        "Matryoshka dimensions on a classifier": (["finetune", "classify", encoder, "--train_file", text,
                                                   "--output_dir", root / "ft", "--matryoshka_dims", "64,32"],
                                                  "--matryoshka_dims is for finetune embed"),
    }


def test_newcomer_mistakes_get_one_line_that_names_the_fix(tmp_path, model_dirs, capsys):
    """Each mistake: exit code 2, no traceback, and a last line that names what is wrong and where."""
    from unmask.cli import main

    mistakes = _mistakes(tmp_path, model_dirs)
    assert len(mistakes) >= 25
    for name, (argv, says) in mistakes.items():
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse's own errors
            code = e.code
        err = capsys.readouterr().err.strip()
        assert code == 2, (name, err)
        assert "Traceback" not in err and says in err.splitlines()[-1], (name, err)


def test_eval_prints_one_line_with_the_metrics_and_the_time(tmp_path, model_dirs):
    """Without --json, `eval` ends with one line: the numbers (a breakdown per entity type is for --json) and the
    time; with --json, the JSON alone on stdout and the time on stderr."""
    conll = tmp_path / "tags.txt"
    conll.write_text("Alice B-PER\nflew O\nto O\nLisbon B-LOC\n\nBob B-PER\nstayed O\n")
    reviews = tmp_path / "reviews.tsv"
    reviews.write_text("sentence\tlabel\na fine film\tpos\na dull film\tneg\n")
    for task, model, data in (("tag", "tag", conll), ("classify", "classify", reviews)):
        argv = [sys.executable, "-m", "unmask.cli", "eval", task, str(model_dirs[model]), "--file", str(data)]
        text = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert text.returncode == 0, text.stderr
        assert re.fullmatch(r"(\S+ [\d.,]+  )+\(\d+\.\d s\)\n", text.stdout), text.stdout
        as_json = subprocess.run(argv + ["--json"], capture_output=True, text=True, timeout=120)
        assert json.loads(as_json.stdout) and re.search(r"done in \d+\.\d s", as_json.stderr)
