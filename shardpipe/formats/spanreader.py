"""Reading spans of samples out of one shard file, for the formats that seek by byte offset.

A :class:`SpanReader` opens its file once, refuses a file shorter than its index before reading a byte,
and reads whole samples with one ``preadv`` per chunk into a buffer it reuses; the format subclass turns
each chunk's bytes into samples. The file descriptor is closed by ``close()``, by ``with``, or when the
reader is dropped. A reader holds no state a fork would break (``preadv`` has no file position), but like
every reader it is meant to be created in the process that uses it. :mod:`.joined` reads runs of several such
shards (a loader's window) into one buffer and cuts them together.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
import weakref
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np

from shardpipe.errors import CorruptShardError, DataError
from shardpipe.formats.base import FormatBase, Offsets, ReaderBase, RemoteBytes, ShardReader
from shardpipe.formats.cutting import (
    Rows,
    add_samples,
    check_spans,
    column_specs,
    cut_columns,
    is_plain,
)
from shardpipe.formats.joined import JoinedWindow, all_joinable, join
from shardpipe.formats.landing import LANDED_MIN_BYTES
from shardpipe.formats.layout import OFFSET, ShardIndex
from shardpipe.formats.mapped import MappedShard, MappedWindow, ScatteredWindow, read_samples
from shardpipe.formats.readbuffer import ReadBuffer
from shardpipe.formats.terms import ColumnsOut, Fields

T = TypeVar("T")
READ_CHUNK = 1 << 20
"""Bytes of whole samples per read (one sample may exceed it): small enough that a chunk is still in the
CPU cache when its samples are checked and sliced (docs/design.md, "Formats and the index")."""


class SpanReader(ReaderBase):
    """Reads samples ``[start, stop)`` of one shard; subclasses implement :meth:`_parse_chunk`
    and :meth:`_check_chunk_framing`."""

    format_name = ""

    def __init__(
        self, path: Path, index: Offsets | None, *, check: bool = True, remote: RemoteBytes | None = None
    ) -> None:
        """``remote``: read by byte ranges (no local file); spans of one ``read_runs`` call are fetched
        together, neighbouring ranges coalesced, and checked like local bytes."""
        self.shard = remote.name if remote is not None else str(path)
        if index is None:
            raise DataError(f"reading {self.format_name} shard {path} needs its offset index")
        self.index = index
        self.verified = check and isinstance(index, ShardIndex) and index.checksums is not None
        """Whether each sample's checksum is checked (a version-2 index, and ``check``)."""
        self._check_framing = check and not self.verified
        """Whether the format's own checks run instead (a version-1 index, or plain offsets)."""
        self._sliced = isinstance(index, ShardIndex) and index.all_plain and not self._check_framing
        """Whether every sample is sliced by a ``ShardIndex`` (none parsed or checked by the format's own
        framing)."""
        self.joinable = remote is None and self._sliced
        """Whether :func:`.joined.join` can read this shard, and it can be read from a map: a local file,
        every sample sliced (fixed when opened: random gets ask at every get)."""
        self._buffer = ReadBuffer()
        self._remote = remote
        self._fetched: dict[int, bytes] = {}  # base offset -> bytes of a run, fetched ahead by read_runs
        end = int(index[len(index) - 1])
        if remote is not None:
            if remote.size < end:
                raise CorruptShardError.at(
                    self.shard, f"object is {remote.size:,} bytes, its index ends at {end:,}"
                )
            self._fd = -1
        else:
            self._fd = _open_checked(path, end)
        self._closer = weakref.finalize(self, _close, self._fd)

    @functools.cached_property
    def mapped(self) -> MappedShard:
        """The file mapped into memory (once, an attribute after that: random gets ask at every get; the
        map lives as long as this reader and its users)."""
        mapped = mmap.mmap(self._fd, 0, prot=mmap.PROT_READ)
        index = self.sliced_index
        table = np.ascontiguousarray(index.table, "<u8").data.cast("B")
        width = index.table.shape[1]
        row = struct.Struct(f"<{width + 1}Q")
        return MappedShard(
            self.shard,
            self._fd,
            index,
            memoryview(mapped),
            mapped,
            self._closer,
            table,
            8 * width,
            row,
            self.verified,
        )

    def close(self) -> None:
        self.__dict__.pop("mapped", None)  # unmapped once no window holds it
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

        index = self.index
        columns = column_specs(index, fields) if isinstance(index, ShardIndex) else []

        def add(view: memoryview, first: int, count: int, base: int, rows: Rows | None) -> None:
            rows = self._sliceable(view, first, base, rows)
            if rows is None:
                add_samples(keys, fields, self._parse_chunk(view, first, count, base))
            else:
                cut_columns(view, rows, columns, start=first, base=base, shard=self.shard, keys=keys)

        fast = self._sliced
        if self.joinable and (joined := join([(self, a, z) for a, z in runs], names, self._buffer)):
            return joined.land(None)
        all_rows = self._rows_of(runs) if fast else [None] * len(runs)
        if self._remote is not None and fast:
            wanted = [(rows[0][OFFSET], rows[-1][OFFSET]) for rows in all_rows if rows is not None]
            self._fetched = dict(zip((a for a, _ in wanted), self._remote.read_ranges(wanted), strict=True))
        for (start, stop), rows in zip(runs, all_rows, strict=True):
            if rows is not None and rows[-1][OFFSET] - rows[0][OFFSET] <= READ_CHUNK:
                base = rows[0][OFFSET]
                view = self._pread(base, rows[-1][OFFSET] - base, start)
                if self.verified:
                    check_spans(view, rows, start, base, self.shard)
                cut_columns(view, rows, columns, start=start, base=base, shard=self.shard, keys=keys)
            else:
                for _ in self._chunks(start, stop, add):
                    pass
        return keys, fields

    def _rows_of(self, runs: Sequence[tuple[int, int]]) -> list[Rows]:
        """Each run's index rows (and the row after its last sample): a slice each, cheaper than one
        gather for the few-sample runs a window reads."""
        index = self.sliced_index
        for start, stop in runs:
            self.check_bounds(start, stop)
        return [index.rows(start, stop) for start, stop in runs]

    def check_bounds(self, start: int, stop: int) -> None:
        num_samples = len(self.index) - 1
        if not 0 <= start <= stop <= num_samples:
            detail = f"samples [{start}, {stop}) requested, the shard holds {num_samples}"
            raise CorruptShardError.at(self.shard, detail, sample_index=min(max(start, 0), num_samples))

    def _pread(self, base: int, size: int, sample_index: int) -> memoryview:
        """``size`` bytes from ``base`` into the reused buffer (or as fetched from a remote shard)."""
        if self._remote is not None:
            data = self._fetched.pop(base, None)
            if data is None or len(data) != size:
                data = self._remote.read_ranges([(base, base + size)])[0]
            if len(data) != size:
                raise CorruptShardError.at(
                    self.shard, "object ends inside the span", sample_index=sample_index, offset=base
                )
            return memoryview(data)
        view = self._buffer.view(size)
        if self.read_into(view, base) != size:
            raise CorruptShardError.at(
                self.shard, "file ends inside the span", sample_index=sample_index, offset=base
            )
        return view

    def _samples(
        self, view: memoryview, first: int, count: int, base: int, rows: Rows | None
    ) -> list[tuple[str, Fields]]:
        rows = self._sliceable(view, first, base, rows)
        if rows is None:
            return self._parse_chunk(view, first, count, base)
        keys: list[str] = []
        fields: dict[str, list[bytes | None]] = {name: [] for name in self.sliced_index.fields}
        columns = column_specs(self.sliced_index, fields)
        cut_columns(view, rows, columns, start=first, base=base, shard=self.shard, keys=keys)
        return [
            (key, {name: value for name, values in fields.items() if (value := values[i]) is not None})
            for i, key in enumerate(keys)
        ]

    def _chunks(
        self, start: int, stop: int, handle: Callable[[memoryview, int, int, int, Rows | None], T]
    ) -> Iterator[T]:
        """``handle(view, first, count, base, rows)`` for each chunk: ``count`` whole samples from ``first``
        read into ``view``
        from byte ``base``, into one reused buffer (a fresh buffer per read costs a page fault per 4 KiB);
        ``rows`` are their index rows (and the next one) when the reader has an index. An error ``handle``
        raises at a byte offset is reported at the sample holding that byte."""
        offsets, shard = self.index, self.shard
        self.check_bounds(start, stop)
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

    def read_into(self, view: memoryview, base: int) -> int:
        """Bytes of the local file from ``base`` into ``view`` (one ``preadv``); how many there were."""
        self.check_open()
        return os.preadv(self._fd, [view], base)

    @property
    def sliced_index(self) -> ShardIndex:
        """The index, for a reader that slices every sample by it (:attr:`joinable`)."""
        return cast(ShardIndex, self.index)

    def _sliceable(self, view: memoryview, start: int, base: int, rows: Rows | None) -> Rows | None:
        """The chunk's index ``rows``, checked, when every sample can be sliced by them; ``None`` to parse."""
        if rows is None:
            return None
        if self.verified:
            check_spans(view, rows, start, base, self.shard)
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

    def locate(
        self,
        parts: Sequence[tuple[ShardReader, int, int]],
        names: Sequence[str],
        buffer: ReadBuffer,
        *,
        any_size: bool = False,
        scattered: bool = False,
    ) -> MappedWindow | ScatteredWindow | JoinedWindow | None:
        spans = cast(Sequence[Part], parts)
        readers = list(dict.fromkeys(reader for reader, _, _ in spans))
        if not all_joinable(readers):
            return None
        slot = {reader: i for i, reader in enumerate(readers)}
        located = [(slot[reader], start, stop) for reader, start, stop in spans]

        def small() -> ScatteredWindow | JoinedWindow | None:  # read one by one, or joined and gathered
            if scattered:
                return ScatteredWindow([r.mapped for r in readers], located, names)
            return join(spans, names, buffer)

        if not any_size:
            offsets = {reader: reader.sliced_index.offsets for reader in readers}
            total = sum(offsets[r].item(stop) - offsets[r].item(start) for r, start, stop in spans)
            if total < LANDED_MIN_BYTES * sum(stop - start for _, start, stop in spans):
                return small()  # a field lands only where it averages that much
        window = MappedWindow([r.mapped for r in readers], located, names, verified=readers[0].verified)
        return window if any_size or window.landed.any() else small()

    def read_samples(
        self, readers: Mapping[int, ShardReader], picks: Sequence[tuple[int, int]], names: Sequence[str]
    ) -> list[dict[str, Any]] | None:
        maps = {}
        for shard, reader in cast(Mapping[int, SpanReader], readers).items():  # one loop: paid every get
            if not reader.joinable:
                return None
            maps[shard] = reader.mapped
        return read_samples(maps, picks, names)
