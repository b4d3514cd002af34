"""Large samples of the formats read by byte offset (tar, TFRecord), landed from a memory map of each shard.

The index says where every sample, key and field lies, so a window is located with a few array operations
and each piece of it is landed by :func:`.landing.land` straight out of the map. Small scattered samples
(random access: a few here and there) are read one by one instead (:class:`ScatteredWindow`): for them a
window's array work would cost more than the samples themselves. A file cut short while it is mapped
would fault the process (SIGBUS) at the first touch past its end, so every piece first checks the size of
each file it reads against the spans it needs, and names the first sample the file no longer holds.
"""

from __future__ import annotations

import mmap
import os
import struct
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardpipe.errors import CorruptShardError
from shardpipe.formats.base import check_open
from shardpipe.formats.checksums import agrees
from shardpipe.formats.landing import Located, Spans, columns_of, land, lands
from shardpipe.formats.layout import CHECKSUM, KEY_START, KEY_STOP, NO_SPAN, OFFSET, ShardIndex
from shardpipe.formats.leases import BufferPool
from shardpipe.formats.terms import ColumnsOut


@dataclass(frozen=True, slots=True)
class MappedShard:
    """An open shard file, its index and its bytes mapped; ``closer`` is its reader's (run once it closed)."""

    name: str
    fd: int
    index: ShardIndex
    data: memoryview
    mapped: mmap.mmap
    """The map ``data`` views: a slice of it is its bytes in one call (a view's takes two)."""
    closer: weakref.finalize[Any, Any]
    table: memoryview
    """The index table's bytes, rows of little-endian uint64 (read a row at a time by scattered gets)."""
    width: int
    """The bytes of one row of ``table``."""
    row: struct.Struct
    """One row of ``table`` and the first value of the next (where the sample ends)."""
    verified: bool
    """Whether each sample's checksum is checked."""


class MappedWindow:
    """The samples of ``parts`` (``(shard, start, stop)``, shard a position in ``shards``), in read order."""

    in_pieces = True  # large fields land in buffers that batches are slices of

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
        index = shards[0].index
        columns = [index.first_field + 2 * index.fields.index(name) for name in names]
        self._columns = np.array(columns)
        self.landed = lands(self._rows[:, self._columns], self._rows[:, self._columns + 1])
        """Which of ``names`` land in buffers of their own (none: the samples are too small to gain)."""

    def land(self, order: np.ndarray, pool: BufferPool) -> ColumnsOut:
        located = self._located(order)
        return land(located.spans, self._names, located.locate, landed=self.landed, pool=pool)

    @contextmanager
    def located(self, order: np.ndarray) -> Iterator[Located]:
        yield self._located(order)

    def _located(self, order: np.ndarray) -> Located:
        rows, ends, shard_of = self._rows[order], self._ends[order], self._shard_of[order]
        self._check_sizes(shard_of, order)
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

        def check(begin: int, end: int) -> None:
            self._check_sizes(shard_of[begin:end], order[begin:end])

        return Located(spans, locate, check)

    def _check_sizes(self, shard_of: np.ndarray, order: np.ndarray) -> None:
        """Every file still holds the samples at ``order`` (:func:`check_sizes`)."""
        shards = {slot: self._shards[slot] for slot in set(shard_of.tolist())}
        check_sizes(shards, lambda: zip(shard_of.tolist(), self._sample_of[order].tolist(), strict=True))


class ScatteredWindow:
    """The samples of ``parts`` (``(shard, start, stop)``, shard a position in ``shards``), a few small ones
    here and there, read one by one by :func:`read_samples`: at a random batch's few samples per shard, the
    array work :class:`MappedWindow` does for a window costs more than such samples themselves."""

    in_pieces = False

    def __init__(
        self, shards: Sequence[MappedShard], parts: Sequence[tuple[int, int, int]], names: Sequence[str]
    ) -> None:
        _check_parts(shards, parts)
        self._shards, self._names = dict(enumerate(shards)), tuple(names)
        self._samples = [(slot, i) for slot, start, stop in parts for i in range(start, stop)]
        """``(shard, sample)`` of each position in read order."""

    def land(self, order: np.ndarray, pool: BufferPool) -> ColumnsOut:
        """The samples at ``order`` (positions in read order; repeats allowed), in that order."""
        samples = read_samples(self._shards, [self._samples[i] for i in order.tolist()], self._names)
        return columns_of(samples, self._names)

    @contextmanager
    def located(self, order: np.ndarray) -> Iterator[Located | None]:
        yield None  # read one by one: nothing to land into a caller's buffers


def read_samples(
    shards: Mapping[int, MappedShard], picks: Sequence[tuple[int, int]], names: Sequence[str]
) -> list[dict[str, Any]]:
    """Each ``(shard, sample)`` of ``picks`` (``shard`` a key of ``shards``; repeats allowed) as a dict of
    its fields' bytes (those of ``names`` it has) and ``__key__``: each one's index row, and where its
    span ends, unpacked from the table's bytes in one call, its span hashed where the map holds it (a
    verified shard), its fields and key copied out. Random gets are this loop: per sample it is all
    they cost (docs/design.md, "Reading").

    Raises :class:`~shardpipe.errors.CorruptShardError` naming the shard and the sample: a checksum that
    differs, a key that is not UTF-8, a file cut short under a sample to be read."""
    check_sizes(shards, lambda: picks)
    ready, layout, columns = {}, None, []
    for slot, shard in shards.items():
        index = shard.index
        if (index.fields, index.first_field) != layout:  # the shards of a split share one, mostly
            layout = index.fields, index.first_field
            columns = [
                (name, index.first_field + 2 * index.fields.index(name))
                for name in names
                if name in index.fields
            ]
        ready[slot] = (
            shard.data,
            shard.mapped,
            shard.table,
            shard.row.unpack_from,
            shard.width,
            columns,
            shard.verified,
        )
    out, agree, no_span = [], agrees, NO_SPAN  # locals: this loop is the whole cost of a get
    for slot, i in picks:
        data, mapped, table, unpack, width, columns, verified = ready[slot]
        row = unpack(table, i * width)  # the sample's row, then where the next one begins: its end
        if verified and not agree(data[row[OFFSET] : row[-1]], row[CHECKSUM]):
            detail = "sample bytes differ from their checksum"
            raise CorruptShardError.at(shards[slot].name, detail, sample_index=i, offset=row[OFFSET])
        sample: dict[str, Any] = {}
        for name, column in columns:
            if (start := row[column]) != no_span:
                sample[name] = mapped[start : row[column + 1]]
        try:
            sample["__key__"] = mapped[row[KEY_START] : row[KEY_STOP]].decode()
        except UnicodeDecodeError as exc:
            detail = f"key is not UTF-8: {exc}"
            raise CorruptShardError.at(shards[slot].name, detail, sample_index=i) from None
        out.append(sample)
    return out


def check_sizes(shards: Mapping[int, MappedShard], picks: Callable[[], Iterable[tuple[int, int]]]) -> None:
    """Every file of ``shards`` (open readers') still holds the samples to be read from it, ``picks()``
    (``(slot, sample)``, asked for only where a file is now shorter than its map): a touch past a mapped
    file's end would fault the process. The one guard of every read from a map; one :func:`file_size` a
    file, the cost of a random get's guard."""
    for slot, shard in shards.items():
        check_open(shard.closer, shard.name)
        if (size := file_size(shard.fd)) >= len(shard.data):
            continue
        offsets = shard.index.offsets
        beyond = [i for s, i in picks() if s == slot and offsets.item(i + 1) > size]
        if beyond:
            detail = f"file is {size:,} bytes now, shorter than when it was opened (cut short?)"
            raise CorruptShardError.at(shard.name, detail, sample_index=min(beyond))


def file_size(fd: int) -> int:
    """The size of an open file now: ``lseek`` to its end costs less than an ``fstat`` (no result object),
    and moving the offset is harmless (every read of a shard says where it reads)."""
    return os.lseek(fd, 0, os.SEEK_END)


def _check_parts(shards: Sequence[MappedShard], parts: Sequence[tuple[int, int, int]]) -> None:
    """Every part's samples lie in its shard (the index says how many it holds)."""
    sizes = [shard.index.num_samples for shard in shards]
    for slot, start, stop in parts:
        if not 0 <= start <= stop <= sizes[slot]:
            detail = f"samples [{start}, {stop}) requested, the shard holds {sizes[slot]}"
            raise CorruptShardError.at(shards[slot].name, detail, sample_index=max(start, 0))
