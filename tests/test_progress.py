"""Progress in a log file: plain lines (no carriage returns), a first and a last one, not one per step."""

from __future__ import annotations

from unmask.progress import progress


def test_a_bar_is_plain_lines_when_stderr_is_not_a_terminal(capfd):
    total = 0
    for n in progress(range(1000), desc="inference", unit="batch"):
        total += n
    err = capfd.readouterr().err
    lines = err.splitlines()
    assert total == 499500 and "\r" not in err
    assert 2 <= len(lines) <= 3 and len(set(lines)) == len(lines)  # the start, the end (a half-minute line)
    assert lines[-1].startswith("inference: 100%") and "1000/1000" in lines[-1]


def test_a_disabled_bar_says_nothing(capfd):
    assert list(progress(range(5), disable=True)) == list(range(5))
    assert capfd.readouterr().err == ""
