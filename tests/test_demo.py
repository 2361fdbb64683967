"""The lesson demo: its numbers, its four variations, its JSON and figure."""

from __future__ import annotations

import json
import math

import pytest

from unmask.cli import main as cli_main
from unmask.demo import DemoOptions, public, run


@pytest.fixture(scope="module")
def default():
    return public(run(DemoOptions()))


def test_json_keys_and_lesson_numbers(default):
    assert set(default) == {"masking", "whole_word_spans", "fill_blank", "worked_example_loss"}
    assert set(default["masking"]) == {"tokens", "selected", "mask", "random", "unchanged"}
    assert set(default["fill_blank"]) == {"test_sentences", "left_only", "both_sides"}
    m = default["masking"]
    assert m["tokens"] == 200_000
    n = m["selected"]
    assert abs(n / 200_000 - 0.15) < 5 * math.sqrt(0.15 * 0.85 / 200_000)
    for key, expected in [("mask", 0.8), ("random", 0.1 * 15 / 16), ("unchanged", 0.1 + 0.1 / 16)]:
        assert abs(m[key] - expected) < 5 * math.sqrt(expected * (1 - expected) / n), key
    assert default["whole_word_spans"] == ["the", "un ##believ ##able", "cat", "play ##ed"]
    fb = default["fill_blank"]
    assert fb["test_sentences"] == 500
    assert abs(fb["left_only"] - 1 / 3) < 5 * math.sqrt(2 / 9 / 500)
    assert fb["both_sides"] == 1.0
    assert default["worked_example_loss"] == 1.1513
    assert math.isclose(default["worked_example_loss"], -(math.log(0.5) + math.log(0.2)) / 2, abs_tol=5e-5)


def test_variation_mlm_probability(default):
    m = public(run(DemoOptions(mlm_probability=0.5)))["masking"]
    assert abs(m["selected"] / m["tokens"] - 0.5) < 0.006
    assert abs(m["mask"] - 0.8) < 0.01


def test_variation_mask_special_tokens(default):
    result = run(DemoOptions(mask_special_tokens=True))
    specials = result["_masking_details"]["_special_selected"]
    assert specials["[CLS]"] > 0 and specials["[SEP]"] > 0
    assert run(DemoOptions())["_masking_details"]["_special_selected"] == {"[CLS]": 0, "[SEP]": 0}
    assert public(result)["masking"]["selected"] > default["masking"]["selected"]


def test_variation_shared_follower_hurts_both_sides(default):
    fb = public(run(DemoOptions(shared_follower=True)))["fill_blank"]
    # sat/ran are now told apart only by chance: (1/2 + 1/2 + 1) / 3 = 2/3
    assert abs(fb["both_sides"] - 2 / 3) < 0.08
    assert fb["both_sides"] < default["fill_blank"]["both_sides"]


def test_variation_blank_subject_right_side_no_help():
    fb = public(run(DemoOptions(blank="subject")))["fill_blank"]
    assert abs(fb["both_sides"] - 1 / 3) < 0.1 and abs(fb["left_only"] - 1 / 3) < 0.1


def test_cli_json_and_plot(tmp_path, capsys, default):
    png = tmp_path / "lesson.png"
    assert cli_main(["demo", "--json", "--plot", str(png)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == default
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_cli_readable_variation_reports_changes(capsys):
    assert cli_main(["demo", "--shared_follower"]) == 0
    out = capsys.readouterr().out
    assert "Against the default run:" in out and "fill_blank.both_sides: 1.0 ->" in out
