"""Reading spans of samples out of one shard file, for the formats that seek by byte offset.

A :class:`SpanReader` opens its file once, refuses a file shorter than its index before reading a byte,
and reads whole samples with one ``preadv`` per chunk into a buffer it reuses; the format subclass turns
each chunk's bytes into samples. The file descriptor is closed by ``close()``, by ``with``, or when the
reader is dropped. A reader holds no state a fork would break (``preadv`` has no file position), but like
every reader it is meant to be created in the process that uses it. :meth:`SpanReader.read_across` reads
runs of several such shards (a loader's window) into one buffer and cuts them together.
"""

from __future__ import annotations

import mmap
import os
import struct
import weakref
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np

from shardpipe.errors import CorruptShardError, DataError, UsageError
from shardpipe.formats.base import FormatBase, Offsets, ReaderBase, RemoteBytes, ShardReader
from shardpipe.formats.cutting import (
    Rows,
    add_samples,
    check_spans,
    column_specs,
    cut_columns,
    cut_rows,
    cut_samples,
    is_plain,
)
from shardpipe.formats.landing import LANDED_MIN_BYTES
from shardpipe.formats.layout import OFFSET, ShardIndex
from shardpipe.formats.mapped import MappedShard, MappedWindow, ScatteredWindow, read_samples
from shardpipe.formats.readbuffer import ReadBuffer
from shardpipe.formats.terms import ColumnsOut, Fields

T = TypeVar("T")
READ_CHUNK = 1 << 20
"""Bytes of whole samples per read (one sample may exceed it): small enough that a chunk is still in the
CPU cache when its samples are checked and sliced (docs/design.md, "Formats and the index")."""
JOINED_BYTES = 4 << 20
"""Bytes of all runs of one :meth:`SpanReader.read_across` call up to which they are read into one buffer
and cut together."""
JOINED_MIN_SAMPLES = 128
"""Samples a :meth:`SpanReader.read_across` call needs before the one-buffer path pays for its fixed cost
(a few dozen numpy calls); fewer go run by run (docs/design.md, "Formats and the index")."""
JOINED_MIN_PARTS = 32
"""Or the parts it needs: that many runs of one or a few samples (a random-access batch) cost more run by
run than in one buffer (docs/design.md, "Formats and the index")."""


class SpanReader(ReaderBase):
    """Reads samples ``[start, stop)`` of one shard; subclasses implement :meth:`_parse_chunk`
    and :meth:`_check_chunk_framing`."""

    format_name = ""

    def __init__(
        self, path: Path, index: Offsets | None, *, check: bool = True, remote: RemoteBytes | None = None
    ) -> None:
        """``remote``: read by byte ranges (no local file); spans of one ``read_runs`` call are fetched
        together, neighbouring ranges coalesced, and checked like local bytes."""
        self._shard = remote.name if remote is not None else str(path)
        if index is None:
            raise DataError(f"reading {self.format_name} shard {path} needs its offset index")
        self._index = index
        self._verified = check and isinstance(index, ShardIndex) and index.checksums is not None
        """Whether each sample's checksum is checked (a version-2 index, and ``check``)."""
        self._check_framing = check and not self._verified
        """Whether the format's own checks run instead (a version-1 index, or plain offsets)."""
        self._buffer = ReadBuffer()
        self._remote = remote
        self._fetched: dict[int, bytes] = {}  # base offset -> bytes of a run, fetched ahead by read_runs
        end = int(index[len(index) - 1])
        if remote is not None:
            if remote.size < end:
                raise CorruptShardError.at(
                    self._shard, f"object is {remote.size:,} bytes, its index ends at {end:,}"
                )
            self._fd = -1
        else:
            self._fd = _open_checked(path, end)
        self._closer = weakref.finalize(self, _close, self._fd)
        self._mapped: MappedShard | None = None

    def mapped(self) -> MappedShard:
        """The file mapped into memory (once; the map lives as long as this reader and its users)."""
        if self._mapped is None:
            mapped = mmap.mmap(self._fd, 0, prot=mmap.PROT_READ)
            closer = self._closer
            index = cast(ShardIndex, self._index)
            table = np.ascontiguousarray(index.table, "<u8").data.cast("B")
            width = index.table.shape[1]
            row = struct.Struct(f"<{width + 1}Q")
            self._mapped = MappedShard(
                self._shard,
                self._fd,
                index,
                memoryview(mapped),
                mapped,
                lambda: closer.alive,
                table,
                8 * width,
                row,
                self._verified,
            )
        return self._mapped

    def close(self) -> None:
        self._mapped = None  # unmapped once no window holds it
        super().close()

    def read(self, start: int, stop: int) -> Iterator[tuple[str, Fields]]:
        """Yield ``(key, fields)`` for samples ``start <= i < stop``."""
        for samples in self._chunks(start, stop, self._samples):
            yield from samples

    def read_runs(self, runs: Sequence[tuple[int, int]], names: Sequence[str]) -> ColumnsOut:
        """Samples of each run ``[start, stop)``, in order, as ``(keys, {name: values})`` with no object
        per sample: the loaders' batch path. A field a sample lacks is ``None``.

        A small run is one read, checked and cut, without the general path's generator: a window reads
        hundreds of runs of a few samples, and per-run costs dominate.
        """
        keys: list[str] = []
        fields: dict[str, list[bytes | None]] = {name: [] for name in names}

        index = self._index
        columns = column_specs(index, fields) if isinstance(index, ShardIndex) else []

        def add(view: memoryview, first: int, count: int, base: int, rows: Rows | None) -> None:
            rows = self._sliceable(view, first, base, rows)
            if rows is None:
                add_samples(keys, fields, self._parse_chunk(view, first, count, base))
            else:
                cut_columns(view, rows, columns, start=first, base=base, shard=self._shard, keys=keys)

        fast = self._sliced
        if self.joinable:
            joined = self.read_across([(self, start, stop) for start, stop in runs], names, self._buffer)
            if joined is not None:
                return joined
        all_rows = self._rows_of(runs) if fast else [None] * len(runs)
        if self._remote is not None and fast:
            wanted = [(rows[0][OFFSET], rows[-1][OFFSET]) for rows in all_rows if rows is not None]
            self._fetched = dict(zip((a for a, _ in wanted), self._remote.read_ranges(wanted), strict=True))
        for (start, stop), rows in zip(runs, all_rows, strict=True):
            if rows is not None and rows[-1][OFFSET] - rows[0][OFFSET] <= READ_CHUNK:
                base = rows[0][OFFSET]
                view = self._pread(base, rows[-1][OFFSET] - base, start)
                if self._verified:
                    check_spans(view, rows, start, base, self._shard)
                cut_columns(view, rows, columns, start=start, base=base, shard=self._shard, keys=keys)
            else:
                for _ in self._chunks(start, stop, add):
                    pass
        return keys, fields

    def _rows_of(self, runs: Sequence[tuple[int, int]]) -> list[Rows]:
        """Each run's index rows (and the row after its last sample): a slice each, cheaper than one
        gather for the few-sample runs a window reads."""
        index = cast(ShardIndex, self._index)
        for start, stop in runs:
            self._check_bounds(start, stop)
        return [index.rows(start, stop) for start, stop in runs]

    def _check_bounds(self, start: int, stop: int) -> None:
        num_samples = len(self._index) - 1
        if not 0 <= start <= stop <= num_samples:
            detail = f"samples [{start}, {stop}) requested, the shard holds {num_samples}"
            raise CorruptShardError.at(self._shard, detail, sample_index=min(max(start, 0), num_samples))

    def _pread(self, base: int, size: int, sample_index: int) -> memoryview:
        """``size`` bytes from ``base`` into the reused buffer (or as fetched from a remote shard)."""
        if self._remote is not None:
            data = self._fetched.pop(base, None)
            if data is None or len(data) != size:
                data = self._remote.read_ranges([(base, base + size)])[0]
            if len(data) != size:
                raise CorruptShardError.at(
                    self._shard, "object ends inside the span", sample_index=sample_index, offset=base
                )
            return memoryview(data)
        view = self._buffer.view(size)
        if not self._closer.alive:
            raise UsageError(f"the reader of {self._shard} is closed")
        if os.preadv(self._fd, [view], base) != size:
            raise CorruptShardError.at(
                self._shard, "file ends inside the span", sample_index=sample_index, offset=base
            )
        return view

    def _samples(
        self, view: memoryview, first: int, count: int, base: int, rows: Rows | None
    ) -> list[tuple[str, Fields]]:
        rows = self._sliceable(view, first, base, rows)
        if rows is None:
            return self._parse_chunk(view, first, count, base)
        return cut_samples(view, rows, self._index, first, base, self._shard)  # type: ignore[arg-type]

    def _chunks(
        self, start: int, stop: int, handle: Callable[[memoryview, int, int, int, Rows | None], T]
    ) -> Iterator[T]:
        """``handle(view, first, count, base, rows)`` for each chunk: ``count`` whole samples from ``first``
        read into ``view``
        from byte ``base``, into one reused buffer (a fresh buffer per read costs a page fault per 4 KiB);
        ``rows`` are their index rows (and the next one) when the reader has an index. An error ``handle``
        raises at a byte offset is reported at the sample holding that byte."""
        offsets, shard = self._index, self._shard
        self._check_bounds(start, stop)
        # One numpy call for the span's rows: a span may be a few samples, and per-call costs dominate.
        rows = offsets.rows(start, stop) if isinstance(offsets, ShardIndex) else None
        if rows is not None:
            bounds = [row[OFFSET] for row in rows]
        else:
            bounds = [int(offsets[i]) for i in range(start, stop + 1)]
        first = 0  # positions in bounds: sample start + first
        while first < stop - start:
            base = bounds[first]
            last = stop - start
            if bounds[last] - base > READ_CHUNK:
                last = max(first + 1, bisect_right(bounds, base + READ_CHUNK, first + 1) - 1)
            view = self._pread(base, bounds[last] - base, start + first)
            try:
                chunk_rows = rows[first : last + 1] if rows is not None else None
                result = handle(view, start + first, last - first, base, chunk_rows)
            except CorruptShardError as exc:
                if exc.sample_index is not None or exc.offset is None:
                    raise
                at = start + bisect_right(bounds, exc.offset) - 1  # the sample holding the byte
                raise CorruptShardError.at(shard, exc.detail, sample_index=at, offset=exc.offset) from exc
            yield result
            first = last

    @property
    def _sliced(self) -> bool:
        """Whether every sample is sliced by a ``ShardIndex`` (none parsed or checked by the format's own
        framing)."""
        index = self._index
        return isinstance(index, ShardIndex) and index.all_plain and not self._check_framing

    @property
    def joinable(self) -> bool:
        """Whether :meth:`read_across` can read this shard: a local file whose samples are all sliced."""
        return self._remote is None and self._sliced

    def _sliceable(self, view: memoryview, start: int, base: int, rows: Rows | None) -> Rows | None:
        """The chunk's index ``rows``, checked, when every sample can be sliced by them; ``None`` to parse."""
        if rows is None:
            return None
        if self._verified:
            check_spans(view, rows, start, base, self._shard)
        if not is_plain(rows):
            return None
        if self._check_framing:
            self._check_chunk_framing(view, start, start + len(rows) - 1, base)
        return rows

    def _check_chunk_framing(self, view: memoryview, start: int, stop: int, base: int) -> None:
        """Without sample checksums (a version-1 index), the format's own checks of a sliced chunk."""
        raise NotImplementedError

    def _parse_chunk(self, view: memoryview, start: int, count: int, base: int) -> list[tuple[str, Fields]]:
        """The ``count`` samples of ``view`` (the file from byte ``base``, sample ``start`` first) by the
        format's parser."""
        raise NotImplementedError

    @staticmethod
    def read_across(
        parts: Sequence[Part], names: Sequence[str], buffer: ReadBuffer, order: np.ndarray | None = None
    ) -> ColumnsOut | None:
        """The samples of ``parts`` from any of one dataset's shards, in ``order`` (positions in read order;
        all in turn when ``None``): every part read end to end into ``buffer`` (grown as needed; one
        ``preadv`` each), then checked and cut together by :func:`cut_rows`, so per sample only the checksum
        call remains (keys and fields are gathered as columns), and what a call costs beyond that is paid
        once for all parts instead of once per shard.

        ``None`` (read them another way) when they hold fewer than ``JOINED_MIN_SAMPLES`` samples in fewer
        than ``JOINED_MIN_PARTS`` parts (the fixed cost of a few dozen numpy calls would dominate) or more
        than ``JOINED_BYTES`` (large samples go the chunked way, which keeps each chunk in the CPU cache
        while it is checked and cut), when a reader is not :attr:`joinable`, or when the shards' indexes
        are laid out differently.

        A method of the reader class, not of one reader: it reads the files and indexes of every reader in
        ``parts``, which are this class's own to read."""
        few = sum(stop - start for _, start, stop in parts) < JOINED_MIN_SAMPLES
        if not parts or (few and len(parts) < JOINED_MIN_PARTS):
            return None
        readers = dict.fromkeys(reader for reader, _, _ in parts)
        first = parts[0][0]
        if not all(reader.joinable and reader._joint_layout() == first._joint_layout() for reader in readers):
            return None
        for reader in readers:
            if not reader._closer.alive:
                raise UsageError(f"the reader of {reader._shard} is closed")
        indexes = {reader: cast(ShardIndex, reader._index) for reader in readers}
        rows, bases, sizes, counts = [], [], [], []
        for reader, start, stop in parts:
            index = indexes[reader]
            offsets = index.offsets
            if not 0 <= start <= stop < len(offsets):
                reader._check_bounds(start, stop)  # raises, naming the shard
            base = offsets.item(start)
            bases.append(base)
            sizes.append(offsets.item(stop) - base)
            counts.append(stop - start)
            rows.append(index.table[start:stop])
        total = sum(sizes)
        if total > JOINED_BYTES:
            return None
        view, at = buffer.view(total), 0
        for (reader, start, stop), base, size in zip(parts, bases, sizes, strict=True):
            if size and (got := os.preadv(reader._fd, [view[at : at + size]], base)) != size:
                offsets = indexes[reader].offsets[start : stop + 1]
                cut = start + int(np.searchsorted(offsets, base + got, side="right")) - 1  # the one it cuts
                raise CorruptShardError.at(
                    reader._shard, "file ends inside the sample", sample_index=cut, offset=base + got
                )
            at += size
        run_counts, run_sizes = np.array(counts, np.int64), np.array(sizes, np.int64)
        positions = np.cumsum(run_sizes) - run_sizes  # where each part starts in the buffer
        run_of = np.repeat(np.arange(len(parts)), run_counts)
        shift = (positions - np.array(bases, np.int64))[run_of]
        table = np.concatenate(rows)
        ends = np.empty(len(table), np.int64)  # in the buffer: where the next sample of the part begins,
        ends[:-1] = table[1:, OFFSET].astype(np.int64) + shift[1:]
        nonempty = run_counts > 0  # or, for a part's last sample, where the part ends
        ends[np.cumsum(run_counts)[nonempty] - 1] = (positions + run_sizes)[nonempty]
        firsts = np.cumsum(run_counts) - run_counts

        def locate(i: int) -> tuple[str, int]:
            run = int(run_of[i])
            reader, start, _ = parts[run]
            return reader._shard, start + i - int(firsts[run])

        return cut_rows(
            view,
            table,
            shift=shift,
            ends=ends,
            index=indexes[first],
            names=names,
            verified=first._verified,
            locate=locate,
            order=order,
        )

    def _joint_layout(self) -> tuple[object, ...]:
        """What must agree for shards to be cut together: their index columns and whether they are checked."""
        index = cast(ShardIndex, self._index)
        return index.fields, index.first_field, self._verified


def _close(fd: int) -> None:
    if fd >= 0:
        os.close(fd)


def _open_checked(path: Path, end: int) -> int:
    shard = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise DataError(f"cannot open shard {shard}: {exc.strerror}") from exc
    size = os.fstat(fd).st_size
    if size < end:
        os.close(fd)
        raise CorruptShardError.at(
            shard, f"file is {size:,} bytes, its index ends at byte {end:,} (truncated?)"
        )
    return fd


Part = tuple[SpanReader, int, int]
"""Samples ``[start, stop)`` of the shard a reader has open."""


class SpanFormat(FormatBase):
    """What the formats read by byte offset share (their ``Format`` classes derive from it)."""

    def read_across(
        self,
        parts: Sequence[tuple[ShardReader, int, int]],
        names: Sequence[str],
        buffer: ReadBuffer,
        order: np.ndarray | None = None,
    ) -> ColumnsOut | None:
        return SpanReader.read_across(cast(Sequence[Part], parts), names, buffer, order)

    def locate(
        self,
        parts: Sequence[tuple[ShardReader, int, int]],
        names: Sequence[str],
        *,
        any_size: bool = False,
        scattered: bool = False,
    ) -> MappedWindow | ScatteredWindow | None:
        spans = cast(Sequence[Part], parts)
        readers = list(dict.fromkeys(reader for reader, _, _ in spans))
        first = readers[0]
        if not all(r.joinable and r._joint_layout() == first._joint_layout() for r in readers):
            return None
        for reader in readers:
            if not reader._closer.alive:
                raise UsageError(f"the reader of {reader._shard} is closed")
        slot = {reader: i for i, reader in enumerate(readers)}
        located = [(slot[reader], start, stop) for reader, start, stop in spans]
        if scattered:
            return ScatteredWindow([r.mapped() for r in readers], located, names)
        if not any_size:
            offsets = {reader: cast(ShardIndex, reader._index).offsets for reader in readers}
            total = sum(offsets[r].item(stop) - offsets[r].item(start) for r, start, stop in spans)
            if total < LANDED_MIN_BYTES * sum(stop - start for _, start, stop in spans):
                return None  # too small to gain: a field lands only where it averages that much
        window = MappedWindow([r.mapped() for r in readers], located, names, verified=first._verified)
        return window if any_size or window.landed.any() else None

    def read_samples(
        self, readers: Mapping[int, ShardReader], picks: Sequence[tuple[int, int]], names: Sequence[str]
    ) -> list[dict[str, Any]] | None:
        maps = {}
        for shard, reader in readers.items():
            mapped = cast(SpanReader, reader)._mapped  # mapped by an earlier call, or not yet
            if mapped is None:
                if not cast(SpanReader, reader).joinable:
                    return None
                mapped = cast(SpanReader, reader).mapped()
            maps[shard] = mapped
        return read_samples(maps, picks, names)
