"""Large samples of the formats read by byte offset (tar, TFRecord), landed from a memory map of each shard.

The index says where every sample, key and field lies, so a window is located with a few array operations
and each piece of it is landed by :func:`.landing.land` straight out of the map. Scattered samples (random
access: a few here and there) are read one by one instead (:class:`ScatteredWindow`): for them a window's
array work would cost more than the samples themselves. A file cut short while it is mapped would fault
the process (SIGBUS) at the first touch past its end, so every piece first checks the size of each file it
reads against the spans it needs, and names the first sample the file no longer holds.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from shardpipe.errors import CorruptShardError, UsageError
from shardpipe.formats.landing import BufferPool, Located, Spans, land, lands
from shardpipe.formats.layout import CHECKSUM, KEY_START, KEY_STOP, NO_SPAN, OFFSET, ShardIndex, checksum
from shardpipe.formats.terms import ColumnsOut


@dataclass(frozen=True, slots=True)
class MappedShard:
    """An open shard file, its index and its bytes mapped; ``alive()`` is false once its reader closed."""

    name: str
    fd: int
    index: ShardIndex
    data: memoryview
    alive: Callable[[], bool]
    table: memoryview
    """The index table's bytes, rows of little-endian uint64 (read a row at a time by scattered gets)."""
    row: struct.Struct
    """One row of ``table``."""


class MappedWindow:
    """The samples of ``parts`` (``(shard, start, stop)``, shard a position in ``shards``), in read order."""

    def __init__(
        self,
        shards: Sequence[MappedShard],
        parts: Sequence[tuple[int, int, int]],
        names: Sequence[str],
        *,
        verified: bool,
    ) -> None:
        self._shards, self._names, self._verified = shards, tuple(names), verified
        _check_parts(shards, parts)
        spans = np.array(parts, np.int64).reshape(-1, 3)  # (parts, 3): shard, start, stop
        counts = spans[:, 2] - spans[:, 1]
        self._shard_of = np.repeat(spans[:, 0], counts)
        firsts = np.cumsum(counts) - counts
        self._sample_of = np.repeat(spans[:, 1] - firsts, counts) + np.arange(int(counts.sum()))
        rows = np.empty((len(self._sample_of), shards[0].index.table.shape[1]), np.uint64)
        ends = np.empty(len(self._sample_of), np.uint64)
        for shard in dict.fromkeys(spans[:, 0].tolist()):  # one gather per shard, not per part
            mine = self._shard_of == shard
            table, picked = shards[shard].index.table, self._sample_of[mine]
            rows[mine], ends[mine] = table[picked], table[picked + 1, OFFSET]
        self._rows = rows.astype(np.int64)  # NO_SPAN becomes -1
        self._ends = ends.astype(np.int64)
        self._checksums = rows[:, CHECKSUM] if verified else None
        self._window_ends = np.zeros(len(shards), np.int64)  # the end of the last span read from each file
        np.maximum.at(self._window_ends, self._shard_of, self._ends)
        index = shards[0].index
        columns = [index.first_field + 2 * index.fields.index(name) for name in names]
        self._columns = np.array(columns)
        self.landed = lands(self._rows[:, self._columns], self._rows[:, self._columns + 1])
        """Which of ``names`` land in buffers of their own (none: the samples are too small to gain)."""

    def land(self, order: np.ndarray, pool: BufferPool) -> ColumnsOut:
        located = self._located(order)
        return land(located.spans, self._names, self.landed, pool, located.locate)

    @contextmanager
    def located(self, order: np.ndarray) -> Iterator[Located]:
        yield self._located(order)

    def _located(self, order: np.ndarray) -> Located:
        rows, ends, shard_of = self._rows[order], self._ends[order], self._shard_of[order]
        self._check_sizes(shard_of, ends, order)
        maps = [shard.data for shard in self._shards]
        spans = Spans(
            sources=[maps[shard] for shard in shard_of.tolist()],
            begins=rows[:, OFFSET],
            ends=ends,
            checksums=None if self._checksums is None else self._checksums[order],
            key_starts=rows[:, KEY_START],
            key_stops=rows[:, KEY_STOP],
            starts=rows[:, self._columns],
            stops=rows[:, self._columns + 1],
        )

        def locate(i: int) -> tuple[str, int]:
            return self._shards[int(shard_of[i])].name, int(self._sample_of[order[i]])

        return Located(spans, locate)

    def _check_sizes(self, shard_of: np.ndarray, ends: np.ndarray, order: np.ndarray) -> None:
        """Every file still holds the spans read from it: a touch past a mapped file's end is a fault."""
        for shard in set(shard_of.tolist()):
            mapped = self._shards[shard]
            if not mapped.alive():
                raise UsageError(f"the reader of {mapped.name} is closed")
            size = os.fstat(mapped.fd).st_size
            if size >= self._window_ends[shard]:
                continue
            beyond = (shard_of == shard) & (ends > size)
            if beyond.any():
                first = int(self._sample_of[order[beyond]].min())
                detail = f"file is {size:,} bytes now, shorter than when it was opened (cut short?)"
                raise CorruptShardError.at(mapped.name, detail, sample_index=first)


class ScatteredWindow:
    """The samples of ``parts`` (``(shard, start, stop)``, shard a position in ``shards``), a few here and
    there, read one by one: each one's index row unpacked from the table's bytes, its span hashed where
    the map holds it, its key and fields copied out as ``bytes``. At a random batch's few samples per
    shard, the array work :class:`MappedWindow` does for a window costs more than this loop
    (docs/design-record.md, "Random gets")."""

    def __init__(
        self,
        shards: Sequence[MappedShard],
        parts: Sequence[tuple[int, int, int]],
        names: Sequence[str],
        *,
        verified: bool,
    ) -> None:
        _check_parts(shards, parts)
        self._shards, self._names, self._verified = shards, tuple(names), verified
        self._samples = [(slot, i) for slot, start, stop in parts for i in range(start, stop)]
        """``(shard, sample)`` of each position in read order."""
        index = shards[0].index
        self._columns = [index.first_field + 2 * index.fields.index(name) for name in names]
        self._row = shards[0].row  # every shard's: their indexes share one layout

    def land(self, order: np.ndarray, pool: BufferPool) -> ColumnsOut:
        """The samples at ``order`` (positions in read order; repeats allowed), in that order."""
        picked = [self._samples[i] for i in order.tolist()]
        self._check_sizes(picked)
        keys: list[str] = []
        values: list[list[bytes | None]] = [[] for _ in self._names]
        columns = list(zip(values, self._columns, strict=True))
        verified, shards = self._verified, self._shards
        row_of, end_of, width = self._row.unpack_from, _OFFSET.unpack_from, self._row.size
        for slot, i in picked:
            shard = shards[slot]
            data, table = shard.data, shard.table
            row = row_of(table, i * width)
            begin, end = row[OFFSET], end_of(table, (i + 1) * width)[0]
            if verified and checksum(data[begin:end]) != row[CHECKSUM]:
                detail = "sample bytes differ from their checksum"
                raise CorruptShardError.at(shard.name, detail, sample_index=i, offset=begin)
            try:
                keys.append(str(data[row[KEY_START] : row[KEY_STOP]], "utf-8"))
            except UnicodeDecodeError as exc:
                detail = f"key is not UTF-8: {exc}"
                raise CorruptShardError.at(shard.name, detail, sample_index=i) from None
            for out, column in columns:
                a = row[column]
                out.append(data[a : row[column + 1]].tobytes() if a != NO_SPAN else None)
        return keys, dict(zip(self._names, values, strict=True))

    @contextmanager
    def located(self, order: np.ndarray) -> Iterator[Located | None]:
        yield None  # read one by one: nothing to land into a caller's buffers

    def _check_sizes(self, picked: list[tuple[int, int]]) -> None:
        """Every file still holds the samples to be read from it: a touch past a mapped file's end would
        fault the process."""
        last = [-1] * len(self._shards)  # the last sample read from each file ends furthest
        for slot, i in picked:
            if i > last[slot]:
                last[slot] = i
        for slot, i in enumerate(last):
            shard = self._shards[slot]
            if i < 0:
                continue
            end = _OFFSET.unpack_from(shard.table, (i + 1) * self._row.size)[0]
            if not shard.alive():
                raise UsageError(f"the reader of {shard.name} is closed")
            if (size := os.fstat(shard.fd).st_size) < end:
                offsets = shard.index.offsets
                first = min(i for s, i in picked if s == slot and offsets.item(i + 1) > size)
                detail = f"file is {size:,} bytes now, shorter than when it was opened (cut short?)"
                raise CorruptShardError.at(shard.name, detail, sample_index=first)


_OFFSET = struct.Struct("<Q")


def _check_parts(shards: Sequence[MappedShard], parts: Sequence[tuple[int, int, int]]) -> None:
    """Every part's samples lie in its shard (the index says how many it holds)."""
    sizes = [shard.index.num_samples for shard in shards]
    for slot, start, stop in parts:
        if not 0 <= start <= stop <= sizes[slot]:
            detail = f"samples [{start}, {stop}) requested, the shard holds {sizes[slot]}"
            raise CorruptShardError.at(shards[slot].name, detail, sample_index=max(start, 0))
