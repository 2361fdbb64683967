"""Files written atomically (a temp file in the same directory, then a rename, so a crash never leaves half a file),
and where caches live."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp)` then rename tmp over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def cache_dir(kind: str) -> Path:
    """`$UNMASK_CACHE/kind`, or `~/.cache/unmask/kind` (token caches, corpus vectors)."""
    return Path(os.environ.get("UNMASK_CACHE") or Path.home() / ".cache" / "unmask") / kind
