"""Writing an LMDB shard: framed samples (:mod:`.framing`, version 2: each with its checksum, never a
pickle) committed in chunks under consecutive index keys (:mod:`.lmdb_env`).

The writer buffers records and commits them with ``append=True``, doubling the map whenever LMDB reports
it full, so nobody has to guess a map size, and the file only holds the pages written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import lmdb
import numpy as np

from shardpipe.errors import DataError
from shardpipe.formats import framing
from shardpipe.formats.layout import KEY_START, KEY_STOP, NO_SPAN, OFFSET, PARSE, ShardIndex, fixed_columns
from shardpipe.formats.lmdb_env import COUNT_KEY, INDEX, VERSION_KEY, open_env
from shardpipe.formats.terms import Column

_INITIAL_MAP_SIZE = 1 << 24
_CHUNK_BYTES = 1 << 20
"""Bytes of records that trigger a commit. Small, so that a record is still in the CPU cache when LMDB
copies it into its page and that page when the commit writes it."""


class LmdbWriter:
    """Buffers framed samples and commits them in chunks under consecutive index keys."""

    def __init__(self, path: Path) -> None:
        Path(path).unlink(missing_ok=True)  # a stale file would be appended to, not replaced
        self._shard = str(path)
        try:
            options = {"sync": False, "metasync": False, "readahead": False}
            self._env = open_env(path, map_size=_INITIAL_MAP_SIZE, **options)
        except lmdb.Error as exc:
            raise DataError(f"cannot create LMDB shard {path}: {exc}") from exc
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
        self._pending += zip(map(INDEX.pack, range(first, first + len(keys))), records, strict=True)
        self._pending_bytes += sum(map(len, records))
        self._num_samples += len(keys)
        self._batches.append((tuple(sorted(names)), _rows(first, len(keys), len(names))))
        if self._pending_bytes >= _CHUNK_BYTES:
            self._commit()

    def _commit(self) -> None:
        try:
            self._put_pending()
        except lmdb.Error as exc:  # a full disk, say: name the shard
            raise DataError(f"cannot write LMDB shard {self._shard}: {exc}") from exc
        self._pending, self._pending_bytes = [], 0

    def _put_pending(self) -> None:
        # Grow the map ahead of the chunk (room for twice its bytes: B-tree and overflow-page slack), so a
        # MapFullError, which throws the whole chunk's transaction away, stays the rare fallback.
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

    def abort(self) -> None:
        self._env.close()

    def close(self) -> ShardIndex:
        self._pending += [(COUNT_KEY, b"%d" % self._num_samples), (VERSION_KEY, b"%d" % framing.VERSION)]
        self._commit()
        self._env.close()  # committed pages are in the page cache; the pack stage fsyncs the shard
        return ShardIndex.from_batches(self._batches, self._num_samples)


def _rows(first: int, num_samples: int, num_fields: int) -> np.ndarray:
    """LMDB seeks by key, not by byte: a sample's "offset" is its position and spans are not recorded."""
    rows = np.full((num_samples, fixed_columns(2) + 2 * num_fields), NO_SPAN, dtype="<u8")  # version-2 rows
    rows[:, OFFSET] = np.arange(first, first + num_samples)
    rows[:, KEY_START : KEY_STOP + 1] = PARSE
    return rows
