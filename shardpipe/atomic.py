"""Crash-safe file placement: content goes to a temporary name, is flushed, then renamed.

A reader never sees a final name holding partial content: ``os.replace`` is atomic on POSIX, and the
directory entry is synced so the rename itself survives a crash.
"""

from __future__ import annotations

import os
from pathlib import Path

TEMP_MARK = ".tmp-"


def temp_path(final: Path) -> Path:
    """Temporary sibling of ``final``; recognisable by :data:`TEMP_MARK` so leftovers can be swept."""
    return final.with_name(f"{final.name}{TEMP_MARK}{os.getpid()}")


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(temp: Path, final: Path) -> None:
    """Flush ``temp`` to disk and rename it to ``final`` atomically."""
    fsync_file(temp)
    os.replace(temp, final)
    fsync_file(final.parent)


def write_bytes_atomic(final: Path, data: bytes) -> None:
    temp = temp_path(final)
    temp.write_bytes(data)
    publish(temp, final)


def sweep_temporaries(root: Path) -> int:
    """Delete temporaries left by an interrupted run; return how many were removed."""
    removed = 0
    for path in root.rglob(f"*{TEMP_MARK}*"):
        if path.is_file():
            path.unlink()
            removed += 1
    return removed
