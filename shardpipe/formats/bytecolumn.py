"""One field's values for many samples as one Arrow binary array: a buffer plus offsets, no object per
sample.

Readers cut a window's fields out of the bytes they read by index arithmetic (:func:`gather`); the loaders
permute and batch those columns with Arrow's ``take`` (a gather in C++), so the batch path never builds a
``bytes`` per sample, and only the per-sample path turns a column into a list (:func:`values`). A sample
that lacks the field is a null. Arrays are ``large_binary`` (64-bit offsets), so no column size limits a
window.

pyarrow is imported on first use, not with this module: its import starts an allocator thread, and the pack
stage, which imports the formats and forks its workers, must stay single-threaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np

ByteColumn: TypeAlias = Any
"""A ``pyarrow.LargeBinaryArray`` (pyarrow has no type hints)."""


def _arrow() -> Any:
    import pyarrow

    return pyarrow


def gather(
    buffer: bytes | memoryview, starts: np.ndarray, stops: np.ndarray, present: np.ndarray | None = None
) -> ByteColumn:
    """Values ``buffer[starts[i]:stops[i]]`` (null where ``present`` is false) copied into one column.

    Ascending, disjoint spans (a field read in sample order) are gathered in one ``take`` over an array
    whose elements are the spans and the gaps between them; others are sliced one by one. A span outside
    ``buffer`` raises ``ValueError``: nothing is ever read past it.
    """
    if not len(starts):
        return column([])
    starts, stops = starts.astype(np.int64, copy=False), stops.astype(np.int64, copy=False)
    if present is not None and not present.all():  # a missing value: an empty span where the last one ended
        hole = np.concatenate(([0], np.maximum.accumulate(np.where(present, stops, 0))[:-1]))
        starts, stops = np.where(present, starts, hole), np.where(present, stops, hole)
    if int(starts.min()) < 0 or int(stops.max()) > len(buffer) or not (stops >= starts).all():
        raise ValueError(f"spans outside a buffer of {len(buffer):,} bytes")
    if not (starts[1:] >= stops[:-1]).all():
        keep = [True] * len(starts) if present is None else present.tolist()
        spans = zip(starts.tolist(), stops.tolist(), keep, strict=True)
        return column([bytes(buffer[a:b]) if wanted else None for a, b, wanted in spans])
    pa = _arrow()
    bounds = np.empty(2 * len(starts), np.int64)
    bounds[0::2], bounds[1::2] = starts, stops
    pieces = [None, pa.py_buffer(bounds), pa.py_buffer(buffer)]
    tiled = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(bounds) - 1, pieces)
    picks = pa.array(np.arange(0, len(bounds), 2), mask=None if present is None else ~present)
    return tiled.take(picks)


def texts(buffer: bytes | memoryview, starts: np.ndarray, stops: np.ndarray) -> list[str] | None:
    """The spans decoded as UTF-8 (keys), or ``None`` when one is not valid UTF-8 (the caller, decoding one
    by one, names it): gathered, checked and decoded in Arrow, no slice per span."""
    pa = _arrow()
    try:
        return list(gather(buffer, starts, stops).cast(pa.large_string()).to_pylist())
    except pa.ArrowInvalid:
        return None


def column(items: Sequence[bytes | None]) -> ByteColumn:
    """A column of ``items`` (``None`` for a missing field): for values that come one by one."""
    pa = _arrow()
    return pa.array(items, pa.large_binary())


def values(col: ByteColumn) -> list[bytes | None]:
    """The column as one ``bytes`` (or ``None``) per sample: what the per-sample path hands out."""
    return list(col.to_pylist())


def concat(columns: Sequence[ByteColumn]) -> ByteColumn:
    return _arrow().concat_arrays(list(columns)) if columns else column([])


def take(col: ByteColumn, order: Sequence[int] | np.ndarray) -> ByteColumn:
    """The values at ``order``, gathered into a new column."""
    return col.take(_arrow().array(np.asarray(order, dtype=np.int64)))


def ragged(col: ByteColumn) -> tuple[bytes, np.ndarray]:
    """The column's values end to end, and the ``len + 1`` offsets into them (from 0); no nulls allowed."""
    offsets = np.frombuffer(col.buffers()[1], np.int64)[col.offset : col.offset + len(col) + 1]
    first, last = (int(offsets[0]), int(offsets[-1])) if len(offsets) else (0, 0)
    data = col.buffers()[2]
    return (data[first:last].to_pybytes() if data is not None else b""), offsets - first
