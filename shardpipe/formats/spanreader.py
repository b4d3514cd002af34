"""Reading spans of samples out of one shard file, for the formats that seek by byte offset.

A :class:`SpanReader` opens its file once, refuses a file shorter than its index before reading a byte,
and reads whole samples with one ``preadv`` per chunk into a buffer it reuses; the format subclass turns
each chunk's bytes into samples. The file descriptor is closed by ``close()``, by ``with``, or when the
reader is dropped. A reader holds no state a fork would break (``preadv`` has no file position), but like
every reader it is meant to be created in the process that uses it.
"""

from __future__ import annotations

import os
import weakref
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from shardpipe.errors import CorruptShardError, DataError, UsageError
from shardpipe.formats import ColumnsOut, Fields, Offsets
from shardpipe.formats.layout import (
    Rows,
    ShardIndex,
    add_samples,
    check_spans,
    cut_columns,
    cut_samples,
    is_plain,
)

T = TypeVar("T")
READ_CHUNK = 1 << 20
"""Bytes of whole samples per read (one sample may exceed it): small enough that a chunk is still in the
CPU cache when its samples are checked and sliced (docs/performance.md, "Formats")."""


class SpanReader:
    """Reads samples ``[start, stop)`` of one shard; subclasses implement :meth:`_read_chunk`."""

    format_name = ""

    def __init__(self, path: Path, index: Offsets | None, *, check: bool = True) -> None:
        self._shard = str(path)
        if index is None:
            raise DataError(f"reading {self.format_name} shard {path} needs its offset index")
        self._index = index
        self._verified = check and isinstance(index, ShardIndex) and index.checksums is not None
        """Whether each sample's checksum is checked (a version-2 index, and ``check``)."""
        self._check_framing = check and not self._verified
        """Whether the format's own checks run instead (a version-1 index, or plain offsets)."""
        self._buffer = bytearray()
        self._fd = _open_checked(path, int(index[len(index) - 1]))
        self._closer = weakref.finalize(self, os.close, self._fd)

    def read(self, start: int, stop: int) -> Iterator[tuple[str, Fields]]:
        """Yield ``(key, fields)`` for samples ``start <= i < stop``."""
        for samples in self._chunks(start, stop, self._samples):
            yield from samples

    def read_columns(self, start: int, stop: int, names: Sequence[str]) -> ColumnsOut:
        """Samples ``[start, stop)`` as ``(keys, {name: values})``, no object per sample: the loaders'
        batch path. A field a sample lacks is ``None``."""
        keys: list[str] = []
        fields: dict[str, list[bytes | None]] = {name: [] for name in names}

        def add(view: memoryview, first: int, last: int, base: int) -> None:
            rows = self._sliceable(view, first, last, base)
            if rows is None:
                add_samples(keys, fields, self._parse_chunk(view, first, last, base))
            else:
                cut_columns(view, rows, self._index, first, base, self._shard, keys, fields)  # type: ignore[arg-type]

        for _ in self._chunks(start, stop, add):
            pass
        return keys, fields

    def _samples(self, view: memoryview, first: int, last: int, base: int) -> list[tuple[str, Fields]]:
        rows = self._sliceable(view, first, last, base)
        if rows is None:
            return self._parse_chunk(view, first, last, base)
        return cut_samples(view, rows, self._index, first, base, self._shard)  # type: ignore[arg-type]

    def _chunks(self, start: int, stop: int, handle: Callable[[memoryview, int, int, int], T]) -> Iterator[T]:
        """``handle(view, first, last, base)`` for each chunk: samples ``[first, last)`` read into ``view``
        from byte ``base``, into one reused buffer (a fresh buffer per read costs a page fault per 4 KiB).
        An error ``handle`` raises at a byte offset is reported at the sample holding that byte."""
        offsets, shard = self._index, self._shard
        num_samples = len(offsets) - 1
        if not 0 <= start <= stop <= num_samples:
            detail = f"samples [{start}, {stop}) requested, the shard holds {num_samples}"
            raise CorruptShardError(shard, detail, sample_index=min(max(start, 0), num_samples))
        index = start
        while index < stop:
            base = int(offsets[index])
            chunk_stop = max(index + 1, bisect_right(offsets, base + READ_CHUNK, index + 1, stop + 1) - 1)
            size = int(offsets[chunk_stop]) - base
            if size > len(self._buffer):
                self._buffer = bytearray(size)
            view = memoryview(self._buffer)[:size]
            if not self._closer.alive:
                raise UsageError(f"the reader of {shard} is closed")
            if os.preadv(self._fd, [view], base) != size:
                raise CorruptShardError(shard, "file ends inside the span", sample_index=index, offset=base)
            try:
                result = handle(view, index, chunk_stop, base)
            except CorruptShardError as exc:
                if exc.sample_index is not None or exc.offset is None:
                    raise
                at = bisect_right(offsets, exc.offset, index, stop + 1) - 1  # the sample holding the byte
                raise CorruptShardError(shard, exc.detail, sample_index=at, offset=exc.offset) from exc
            yield result
            index = chunk_stop

    def _sliceable(self, view: memoryview, start: int, stop: int, base: int) -> Rows | None:
        """The chunk's index rows, checked, when every sample can be sliced by them; ``None`` to parse."""
        index = self._index
        if not isinstance(index, ShardIndex):
            return None
        rows = index.rows(start, stop)
        if self._verified:
            check_spans(view, rows, start, base, self._shard)
        if not is_plain(rows):
            return None
        if self._check_framing:
            self._check_chunk_framing(view, start, stop, base)
        return rows

    def _check_chunk_framing(self, view: memoryview, start: int, stop: int, base: int) -> None:
        """Without sample checksums (a version-1 index), the format's own checks of a sliced chunk."""
        raise NotImplementedError

    def _parse_chunk(self, view: memoryview, start: int, stop: int, base: int) -> list[tuple[str, Fields]]:
        """Samples ``[start, stop)`` of ``view`` (the file from byte ``base``) by the format's parser."""
        raise NotImplementedError

    def close(self) -> None:
        self._closer()

    def __enter__(self) -> SpanReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _open_checked(path: Path, end: int) -> int:
    shard = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise DataError(f"cannot open shard {shard}: {exc.strerror}") from exc
    size = os.fstat(fd).st_size
    if size < end:
        os.close(fd)
        raise CorruptShardError(shard, f"file is {size:,} bytes, its index ends at byte {end:,} (truncated?)")
    return fd
