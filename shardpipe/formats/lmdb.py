"""LMDB shards: one single-file environment per shard, samples under 8-byte big-endian indices.

Values are :mod:`shardpipe.formats.framing` records, never pickles. Two metadata entries sort after every
index key: ``__count__`` (ASCII sample count) and ``__shardpipe__`` (framing version). The writer opens the
file without a lock file (``lock=False``), so renaming the one file publishes the whole shard. It buffers
records and commits them in chunks with ``append=True``, doubling the map whenever LMDB reports it full, so
nobody has to guess a map size, and the file only holds the pages written. Readers open each shard lazily,
read-only, once per process: the cache is keyed by pid, so an environment never crosses a fork.
"""

from __future__ import annotations

import os
import struct
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from shardpipe.errors import CorruptShardError
from shardpipe.formats import Column, Fields, Offsets, framing
from shardpipe.formats.layout import NO_SPAN, PARSE, SampleLayout, ShardIndex

COUNT_KEY = b"__count__"
VERSION_KEY = b"__shardpipe__"
_INDEX = struct.Struct(">Q")
_INITIAL_MAP_SIZE = 1 << 24
_CHUNK_BYTES = 1 << 20
"""Bytes of records that trigger a commit. Small, so that with the pack stage's 1 MiB batches a record is
still in the CPU cache when LMDB copies it into its page and that page when the commit writes it:
``pack()`` of 8,000 64 KiB files took 0.48 s with 32 MiB commits of 16 MiB batches, 0.34 s with 1 MiB of
each (medians of 10 interleaved pairs); 60,000 1 KiB files took 0.96x the time."""
_MAX_OPEN = 64  # environments kept open per process: each holds a file descriptor and a mapping


def _open(path: Path, **options: Any) -> lmdb.Environment:
    return lmdb.open(str(path), subdir=False, lock=False, **options)


class LmdbWriter:
    """Buffers framed samples and commits them in chunks under consecutive index keys."""

    def __init__(self, path: Path) -> None:
        Path(path).unlink(missing_ok=True)  # a stale file would be appended to, not replaced
        self._env = _open(path, map_size=_INITIAL_MAP_SIZE, sync=False, metasync=False, readahead=False)
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._num_samples = 0
        self._batches: list[tuple[tuple[str, ...], np.ndarray]] = []

    def write(self, key: str, fields: Mapping[str, bytes]) -> None:
        self.write_batch([key], list(fields), [[data] for data in fields.values()])

    def write_batch(self, keys: Sequence[str], names: Sequence[str], columns: Sequence[Column]) -> None:
        if not keys:
            return
        first = self._num_samples
        records = [b"".join(pieces) for pieces in framing.encode_batch(keys, names, columns)]
        self._pending += zip(map(_INDEX.pack, range(first, first + len(keys))), records, strict=True)
        self._pending_bytes += sum(map(len, records))
        self._num_samples += len(keys)
        self._batches.append((tuple(sorted(names)), _rows(first, len(keys), len(names))))
        if self._pending_bytes >= _CHUNK_BYTES:
            self._commit()

    def _commit(self) -> None:
        # Grow the map ahead of the chunk (room for twice its bytes: B-tree and overflow-page slack), so a
        # MapFullError, which throws the whole chunk's transaction away, stays the rare fallback. Measured on
        # a shard of 1,000 64 KiB samples: 0.23-0.52 s -> 0.17 s.
        info = self._env.info()
        needed = (info["last_pgno"] + 1) * self._env.stat()["psize"] + 2 * self._pending_bytes + (1 << 20)
        if info["map_size"] < needed:
            self._env.set_mapsize(max(info["map_size"] * 2, needed))
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    txn.cursor().putmulti(self._pending, append=True)
                break
            except lmdb.MapFullError:
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
        self._pending, self._pending_bytes = [], 0

    def abort(self) -> None:
        self._env.close()

    def close(self) -> ShardIndex:
        self._pending += [(COUNT_KEY, b"%d" % self._num_samples), (VERSION_KEY, b"%d" % framing.VERSION)]
        self._commit()
        self._env.close()  # committed pages are in the page cache; the pack stage fsyncs the shard
        return ShardIndex.from_batches(self._batches, self._num_samples)


def _rows(first: int, num_samples: int, num_fields: int) -> np.ndarray:
    """LMDB seeks by key, not by byte: a sample's "offset" is its position and spans are not recorded."""
    rows = np.full((num_samples, 3 + 2 * num_fields), PARSE, dtype="<u8")
    rows[:, 0] = np.arange(first, first + num_samples)
    rows[:, 3:] = NO_SPAN
    return rows


_envs: OrderedDict[tuple[str, int, int], lmdb.Environment] = OrderedDict()
_envs_pid = os.getpid()


def _cached_env(path: Path) -> lmdb.Environment:
    """This process's read-only environment for ``path``, reopened if the file was replaced.

    Environments inherited through a fork are closed in the child, never used: closing frees the child's
    copy of the mapping and clears py-lmdb's per-process "already open" mark, which a fork also copies and
    which would otherwise refuse to reopen the same file.
    """
    global _envs_pid
    shard = str(path)
    if _envs_pid != os.getpid():
        for inherited in _envs.values():
            inherited.close()
        _envs.clear()
        _envs_pid = os.getpid()
    try:
        stat = Path(path).stat()
        key = (shard, stat.st_ino, stat.st_mtime_ns)
        env = _envs.get(key)
        if env is None:
            env = _open(path, readonly=True, readahead=True, max_spare_txns=1)
            _check_complete(env, stat.st_size, shard)
            _envs[key] = env
            while len(_envs) > _MAX_OPEN:
                _envs.popitem(last=False)  # an open transaction keeps its environment alive
        else:
            _envs.move_to_end(key)
        return env
    except (OSError, lmdb.Error) as exc:
        raise CorruptShardError(shard, f"cannot open LMDB environment: {exc}") from exc


def _check_complete(env: lmdb.Environment, file_size: int, shard: str) -> None:
    """A truncated file would fault the process (SIGBUS) when LMDB touches a missing page: refuse it first."""
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    if file_size < needed:
        env.close()
        raise CorruptShardError(shard, f"truncated: {file_size:,} bytes, its pages need {needed:,}")


def close_environments() -> None:
    """Close this process's cached read environments.

    py-lmdb refuses to open a file twice in one process, so code that opens a shard itself (to repair or
    inspect it) calls this first. Transactions still open in live readers become invalid.
    """
    for env in _envs.values():
        env.close()
    _envs.clear()


class LmdbFormat:
    name = "lmdb"
    suffix = ".lmdb"
    needs_index = False

    def open_writer(self, path: Path) -> LmdbWriter:
        return LmdbWriter(path)

    def read(
        self, path: Path, start: int, stop: int, offsets: Offsets | None = None
    ) -> Iterator[tuple[str, Fields]]:
        if stop <= start:
            return
        shard = str(path)
        with _cached_env(path).begin(buffers=True) as txn:
            num_samples = bytes(txn.get(COUNT_KEY) or b"")
            if not num_samples.isdigit() or stop > int(num_samples):
                detail = f"samples [{start}, {stop}) requested, the shard holds {num_samples.decode()!r}"
                raise CorruptShardError(shard, detail, sample_index=start)
            cursor = txn.cursor()
            if not cursor.set_key(_INDEX.pack(start)):
                raise CorruptShardError(shard, "no record under this index", sample_index=start)
            values = cursor.iternext(keys=False, values=True)
            for index in range(start, stop):
                value = next(values, None)
                if value is None or (index == stop - 1 and bytes(cursor.key()) != _INDEX.pack(index)):
                    raise CorruptShardError(shard, "records are missing or out of order", sample_index=index)
                try:
                    sample = framing.decode(value)
                except framing.FramingError as exc:
                    raise CorruptShardError(shard, str(exc), sample_index=index) from exc
                yield sample

    def scan(self, path: Path) -> tuple[list[str], list[SampleLayout], int]:
        shard = str(path)
        keys: list[str] = []
        layouts: list[SampleLayout] = []
        with _cached_env(path).begin(buffers=True) as txn:
            meta = {key: bytes(txn.get(key) or b"") for key in (COUNT_KEY, VERSION_KEY)}
            for raw_key, value in txn.cursor():
                if raw_key in (COUNT_KEY, VERSION_KEY):
                    continue
                if bytes(raw_key) != _INDEX.pack(len(keys)):
                    raise CorruptShardError(
                        shard, f"unexpected key {bytes(raw_key)!r}", sample_index=len(keys)
                    )
                try:
                    key, fields = framing.decode(value)
                except framing.FramingError as exc:
                    raise CorruptShardError(shard, str(exc), sample_index=len(keys)) from exc
                layouts.append(SampleLayout(len(keys), None, dict.fromkeys(fields)))
                keys.append(key)
        if meta[VERSION_KEY] != b"%d" % framing.VERSION:
            raise CorruptShardError(
                shard, f"framing version {meta[VERSION_KEY]!r}, expected {framing.VERSION}"
            )
        if meta[COUNT_KEY] != b"%d" % len(keys):
            raise CorruptShardError(
                shard, f"{COUNT_KEY!r} says {meta[COUNT_KEY]!r}, found {len(keys)} records"
            )
        return keys, layouts, len(keys)


FORMAT = LmdbFormat()
