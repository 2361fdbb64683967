"""One error family: every mistake a user can make (a file, a flag, a directory, a request) raises an `UnmaskError`
whose message names the thing and the fix. `unmask` prints it on one line and exits 2; anything else is a bug and
keeps its traceback. Each subclass also derives from the built-in error of its kind, so `except ValueError` in a
caller's code still works.
"""

from __future__ import annotations


class UnmaskError(Exception):
    """The base of every error a user can act on."""


class ConfigError(UnmaskError, ValueError):
    """A config that cannot describe a model; the message names the field."""


class CheckpointError(UnmaskError, ValueError):
    """A model directory that cannot be loaded as asked; the message names the file and the mismatch."""


class DataError(UnmaskError, ValueError):
    """Input data that cannot be used as asked; the message names the file and what is wrong."""


class UsageError(UnmaskError, ValueError):
    """Arguments that do not fit together or are out of range; the message names the flag."""


class TrainingError(UnmaskError, RuntimeError):
    """Training cannot go on (a NaN loss, a bad resume point); the message says what to change."""
