"""One field's values for many samples: an Arrow binary array when they are small, a list when large.

Readers cut a window's fields out of the bytes they read by index arithmetic (:func:`gather`), picking
them in the window's shuffled order. Small values (1 KiB, say) become one Arrow ``large_binary`` array, a
buffer plus offsets, copied with Arrow's ``take`` (a gather in C++); the loaders cut batches from it, so
no ``bytes`` exists per sample, whose creation, permutation and joining cost more than the bytes' copy.
Large values stay one ``bytes`` each: there the copies are the cost, and a list is permuted and joined
with fewer of them than Arrow's immutable arrays (docs/design.md, "Reading"). Values
that come one by one (slow paths, foreign records) are lists too. Every function here takes either; a
missing value is ``None`` (a null in Arrow).

pyarrow is imported on first use, not with this module: its import starts an allocator thread, and the pack
stage, which imports the formats and forks its workers, must stay single-threaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np

from shardpipe.formats.terms import ColumnsOut

ByteColumn: TypeAlias = Any
"""A ``pyarrow.LargeBinaryArray`` or a ``list[bytes | None]`` (pyarrow has no type hints)."""

ARROW_MAX_MEAN_BYTES = 2048
""":func:`gather` makes an Arrow array of values at most this long on average, a list of longer ones."""


def _arrow() -> Any:
    import pyarrow

    return pyarrow


def gather(
    buffer: bytes | memoryview,
    starts: np.ndarray,
    stops: np.ndarray,
    present: np.ndarray | None = None,
    order: np.ndarray | None = None,
) -> ByteColumn:
    """Values ``buffer[starts[i]:stops[i]]`` (``None`` where ``present`` is false) for i in ``order`` (all,
    in turn, when ``None``), copied out.

    Small ascending, disjoint spans (a field read in sample order) are gathered in one ``take`` over an
    array whose elements are the spans and the gaps between them, picking them in ``order``: a window is
    shuffled by the copy that cuts it, not by a second one. Others are sliced one by one. A span outside
    ``buffer`` raises ``ValueError``: nothing is ever read past it.
    """
    if not len(starts):
        return []
    starts, stops = starts.astype(np.int64, copy=False), stops.astype(np.int64, copy=False)
    if present is not None and not present.all():  # a missing value: an empty span where the last one ended
        hole = np.concatenate(([0], np.maximum.accumulate(np.where(present, stops, 0))[:-1]))
        starts, stops = np.where(present, starts, hole), np.where(present, stops, hole)
    if int(starts.min()) < 0 or int(stops.max()) > len(buffer) or not (stops >= starts).all():
        raise ValueError(f"spans outside a buffer of {len(buffer):,} bytes")
    small = int((stops - starts).sum()) <= ARROW_MAX_MEAN_BYTES * len(starts)
    if not small or not (starts[1:] >= stops[:-1]).all():
        keep = np.ones(len(starts), bool) if present is None else present
        if order is not None:
            starts, stops, keep = starts[order], stops[order], keep[order]
        spans = zip(starts.tolist(), stops.tolist(), keep.tolist(), strict=True)
        return [bytes(buffer[a:b]) if wanted else None for a, b, wanted in spans]
    pa = _arrow()
    bounds = np.empty(2 * len(starts), np.int64)
    bounds[0::2], bounds[1::2] = starts, stops
    pieces = [None, pa.py_buffer(bounds), pa.py_buffer(buffer)]
    tiled = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(bounds) - 1, pieces)
    picks = np.arange(len(starts)) if order is None else np.asarray(order, np.int64)
    return tiled.take(pa.array(2 * picks, mask=None if present is None else ~present[picks]))


def packed(data: np.ndarray, sizes: np.ndarray) -> ByteColumn:
    """Values of ``sizes`` bytes each, end to end in ``data`` (uint8), as an Arrow array over it: no copy."""
    pa = _arrow()
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(sizes), buffers)


def texts(
    buffer: bytes | memoryview, starts: np.ndarray, stops: np.ndarray, order: np.ndarray | None = None
) -> list[str] | None:
    """The spans decoded as UTF-8 (keys), in ``order`` as :func:`gather` takes it, or ``None`` when one is
    not valid UTF-8 (the caller, decoding one by one, names it): gathered, checked and decoded in Arrow, no
    slice per span."""
    column = gather(buffer, starts, stops, order=order)
    if isinstance(column, list):  # spans out of order, or unusually long
        try:
            return [value.decode() for value in column]
        except UnicodeDecodeError:
            return None
    pa = _arrow()
    try:
        return list(column.cast(pa.large_string()).to_pylist())
    except pa.ArrowInvalid:
        return None


def values(column: ByteColumn) -> list[bytes | None]:
    """The column as one ``bytes`` (or ``None``) per sample: what the per-sample path hands out."""
    return column if isinstance(column, list) else list(column.to_pylist())


def concat(columns: Sequence[ByteColumn]) -> ByteColumn:
    """The columns one after another: a list when all are, else one Arrow array (a list among Arrow
    columns converted in one call: cheaper than a ``bytes`` object per Arrow value)."""
    if all(isinstance(column, list) for column in columns):
        return [value for column in columns for value in column]
    pa = _arrow()
    arrays = [pa.array(c, pa.large_binary()) if isinstance(c, list) else c for c in columns]
    return pa.concat_arrays(arrays)


def take_across(columns: Sequence[ByteColumn], order: np.ndarray) -> ByteColumn:
    """The values at ``order`` of the columns one after another, copied once: a list when all are lists,
    else one Arrow array (Arrow's take over the columns as the chunks of one array)."""
    if all(isinstance(column, list) for column in columns):
        joined = [value for column in columns for value in column]
        return [joined[i] for i in order.tolist()]
    pa = _arrow()
    chunks = [pa.array(c, pa.large_binary()) if isinstance(c, list) else c for c in columns]
    taken = pa.chunked_array(chunks, pa.large_binary()).take(pa.array(order, pa.int64()))
    return taken.chunk(0) if taken.num_chunks == 1 else taken.combine_chunks()


def cut(column: ByteColumn, start: int, stop: int) -> ByteColumn:
    """Values ``[start, stop)``, sharing the column's memory (an Arrow slice, or a list's slice)."""
    return column[start:stop] if isinstance(column, list) else column.slice(start, stop - start)


def take(column: ByteColumn, order: Sequence[int] | np.ndarray) -> ByteColumn:
    """The values at ``order``, as a new column of the same kind."""
    if isinstance(column, list):
        return [column[i] for i in (order.tolist() if isinstance(order, np.ndarray) else order)]
    return column.take(_arrow().array(np.asarray(order, dtype=np.int64)))


def in_order(columns: ColumnsOut, order: Sequence[int] | np.ndarray | None) -> ColumnsOut:
    """Keys and fields at ``order`` (as they are for ``None``): for reads that cannot pick as they copy."""
    if order is None:
        return columns
    keys, fields = columns
    picks = order.tolist() if isinstance(order, np.ndarray) else order
    return [keys[i] for i in picks], {name: take(column, picks) for name, column in fields.items()}


def first_missing(column: ByteColumn, start: int, stop: int) -> int | None:
    """The first position in ``[start, stop)`` whose value is missing, if any."""
    if isinstance(column, list):
        part = column[start:stop]
        return start + part.index(None) if None in part else None
    part = column.slice(start, stop - start)
    return start + part.is_null().index(True).as_py() if part.null_count else None


def ragged(column: ByteColumn, start: int, stop: int) -> tuple[bytes | memoryview, np.ndarray]:
    """Values ``[start, stop)`` end to end, and the ``stop - start + 1`` offsets into them (from 0); none
    may be missing. An Arrow column's values are already end to end: they come as a read-only view of its
    buffer, not a copy (the view keeps the buffer alive)."""
    if isinstance(column, list):
        part = column[start:stop]
        offsets = np.zeros(len(part) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, part), dtype=np.int64, count=len(part)), out=offsets[1:])
        return b"".join(part), offsets
    part = column.slice(start, stop - start)
    offsets = np.frombuffer(part.buffers()[1], np.int64)[part.offset : part.offset + len(part) + 1]
    first, last = int(offsets[0]), int(offsets[-1])
    data = part.buffers()[2]
    return (memoryview(data).cast("B").toreadonly()[first:last] if data is not None else b""), offsets - first
