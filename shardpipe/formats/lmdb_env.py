"""LMDB shards' keys and environments: one single-file environment per shard, opened once per process.

Samples sit under 8-byte big-endian indices (``INDEX``); two metadata entries sort after every index
key: ``COUNT_KEY`` (ASCII sample count) and ``VERSION_KEY`` (framing version). Files are opened without a
lock file (``lock=False``), so renaming the one file publishes the whole shard.

py-lmdb opens a file once per process, so readers of one file in one process share its environment
(:func:`acquire`), which is unmapped when the last one lets go (:func:`release`). An environment never
crosses a fork: those inherited are closed in the child, never used. Before LMDB touches a page the file
must hold every page its metadata claims, so a truncated file reads as an error, not a fault (SIGBUS).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import lmdb

from shardpipe.errors import CorruptShardError, DataError

COUNT_KEY = b"__count__"
VERSION_KEY = b"__shardpipe__"
INDEX = struct.Struct(">Q")
"""A sample's key: its index in the shard, big-endian, so that keys sort in sample order."""


def open_env(path: Path, **options: Any) -> lmdb.Environment:
    return lmdb.open(str(path), subdir=False, lock=False, **options)


def small(value: bytes | memoryview | None) -> bytes:
    """A key or metadata value as bytes; ``b"?"`` when it is too long to be one, without touching it (a
    damaged length must not lead the copy past the file's end)."""
    if value is None:
        return b""
    return bytes(value) if len(value) <= 64 else b"?"


_shared: dict[tuple[int, int], list[Any]] = {}  # (device, inode) -> [environment, readers holding it]
_shared_pid = os.getpid()


def acquire(path: Path) -> tuple[lmdb.Environment, tuple[int, int], int]:
    """This process's read-only environment for ``path`` (mapped now, or shared with a live reader of the
    same file), its registry key and the file's size.

    Environments inherited through a fork are closed in the child, never used: closing frees the child's
    copy of the mapping and clears py-lmdb's per-process "already open" mark, which a fork also copies.
    """
    global _shared_pid
    shard = str(path)
    if _shared_pid != os.getpid():
        for env, _ in _shared.values():
            env.close()
        _shared.clear()
        _shared_pid = os.getpid()
    try:
        stat = Path(path).stat()
    except OSError as exc:
        raise DataError(f"cannot open shard {shard}: {exc.strerror}") from exc
    key = (stat.st_dev, stat.st_ino)
    if key in _shared:
        _shared[key][1] += 1
        return _shared[key][0], key, stat.st_size
    try:
        env = open_env(path, readonly=True, readahead=True, max_spare_txns=1)
    except lmdb.Error as exc:
        raise CorruptShardError.at(shard, f"cannot open LMDB environment: {exc}") from exc
    try:
        _check_complete(env, stat.st_size, shard)
    except BaseException:
        env.close()
        raise
    _shared[key] = [env, 1]
    return env, key, stat.st_size


def release(key: tuple[int, int], pid: int) -> None:
    """Drop a reader's hold; the last one unmaps the environment (never in another process)."""
    entry = _shared.get(key)
    if entry is None or pid != os.getpid() or _shared_pid != pid:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _shared[key]
        entry[0].close()


def _check_complete(env: lmdb.Environment, file_size: int, shard: str) -> None:
    """A truncated file would fault the process (SIGBUS) when LMDB touches a missing page: refuse it first."""
    try:
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    except lmdb.Error as exc:
        raise CorruptShardError.at(shard, f"unreadable LMDB metadata: {exc}") from exc
    if file_size < needed:
        raise CorruptShardError.at(shard, f"truncated: {file_size:,} bytes, its pages need {needed:,}")
