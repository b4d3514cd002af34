"""Local file primitives: crash-safe placement (temporary name, flush, rename) and content hashes.

A reader never sees a final name holding partial content: ``os.replace`` is atomic on POSIX, and the
directory entry is synced so the rename itself survives a crash.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import stat
from functools import cache
from pathlib import Path
from typing import Any, BinaryIO

TEMP_MARK = ".tmp-"
_SYNC_FILE_RANGE_WRITE = 2


def temp_path(final: Path) -> Path:
    """Temporary sibling of ``final``; recognisable by :data:`TEMP_MARK` so leftovers can be swept."""
    return final.with_name(f"{final.name}{TEMP_MARK}{os.getpid()}")


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading, refused (``OSError``) unless it is a regular file: where a dataset names
    a file, a FIFO would block its reader for ever and a device would read without end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO opens at once, unread
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, a device or a folder)", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """A regular file's bytes (see :func:`open_regular`), refused where it holds more than ``limit``."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise OSError(
                errno.EFBIG, f"{size:,} bytes, more than the {limit:,} it may hold", os.fspath(path)
            )
        return f.read(limit)


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open_regular(path) as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def start_writeback(path: os.PathLike[str] | str) -> None:
    """Ask the kernel to start writing ``path``'s dirty pages to disk now, without waiting.

    Called before a shard is checksummed: the write-back overlaps the checksum pass, so the fsync in
    :func:`publish` waits for little. Linux only (through ``ctypes``); elsewhere it does nothing.
    """
    sync_file_range = getattr(libc(), "sync_file_range", None)
    if sync_file_range is None:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        sync_file_range(fd, ctypes.c_int64(0), ctypes.c_int64(0), ctypes.c_uint(_SYNC_FILE_RANGE_WRITE))
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


@cache
def libc() -> Any:
    """This process's C library through ``ctypes``, or ``None`` where it cannot be loaded."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
