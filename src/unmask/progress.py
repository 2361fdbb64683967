"""Progress bars that stay readable in a log file: on a terminal, tqdm's bar; otherwise the same status as plain
lines, one every half minute and one at the end (a bar's carriage returns would make a log one endless line)."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

LOG_INTERVAL_S = 30.0


class _Lines:
    """A file for tqdm that turns each redraw into one line."""

    def __init__(self, stream):
        self.stream, self.last = stream, None

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line and line != self.last:  # closing redraws the final state once more
            self.stream.write(line + "\n")
            self.last = line

    def flush(self) -> None:
        self.stream.flush()


def progress(iterable=None, *, disable: bool = False, **options) -> tqdm:
    """`tqdm(iterable, **options)` on stderr; as plain lines when stderr is not a terminal."""
    if disable or sys.stderr.isatty():
        return tqdm(iterable, disable=disable, file=sys.stderr, **options)
    return tqdm(iterable, file=_Lines(sys.stderr), mininterval=LOG_INTERVAL_S, ascii=True, ncols=100, **options)
