"""The README's printed figures are what the commands print: the lesson's JSON, every figure in the comments of the
`unmask demo` variations, and the quickstart's sample lines (run as a user runs them, a new process each)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def unmask(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "unmask.cli", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def blocks(language: str) -> list[str]:
    """The README's fenced blocks of `language` ("" for plain ones), in order."""
    found, current, opened = [], None, ""
    for line in README.splitlines():
        if line.startswith("```"):
            if current is None:
                current, opened = [], line[3:].strip()
            else:
                if opened == language:
                    found.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return found


def test_the_lesson_json_is_what_demo_prints():
    shown = next(block for block in blocks("json") if '"masking"' in block)
    assert json.loads(shown) == json.loads(unmask("demo", "--json"))


def test_the_figures_in_the_demo_variations_are_printed():
    variations = [line for block in blocks("bash") for line in block.splitlines()
                  if line.startswith("unmask demo --") and "#" in line]
    checked = 0
    for line in variations:
        command, comment = line.split("#", 1)
        figures = re.findall(r"\d+\.\d+", comment)
        if figures:
            printed = unmask(*command.split()[1:])
            for figure in figures:
                assert figure in printed, (line, figure)
            checked += 1
    assert checked >= 2  # --shared_follower and --blank subject state figures


def test_the_quickstart_sample_lines_are_printed(tmp_path):
    shown = next(block for block in blocks("") if "<- right" in block)
    printed = unmask("quickstart", "--output_dir", str(tmp_path / "qs"))
    for line in shown.strip().splitlines():
        assert " ".join(line.split()) in " ".join(printed.split()), line
