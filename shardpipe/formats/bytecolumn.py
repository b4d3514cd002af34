"""One field's values for many samples as one Arrow binary array: a buffer plus offsets, no object per
sample.

Readers cut a window's fields out of the bytes they read by index arithmetic (:func:`gather`); the loaders
permute and batch those columns with Arrow's ``take`` (a gather in C++), so the batch path never builds a
``bytes`` per sample, and only the per-sample path turns a column into a list (:func:`values`). A sample
that lacks the field is a null. Arrays are ``large_binary`` (64-bit offsets), so no column size limits a
window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa

ByteColumn: TypeAlias = Any
"""A ``pyarrow.LargeBinaryArray`` (pyarrow has no type hints)."""

BINARY = pa.large_binary()


def gather(
    buffer: bytes | memoryview, starts: np.ndarray, stops: np.ndarray, present: np.ndarray | None = None
) -> ByteColumn:
    """Values ``buffer[starts[i]:stops[i]]`` (null where ``present`` is false) copied into one column.

    The spans must lie inside ``buffer``; ascending and disjoint ones (a field read in sample order) are
    gathered in one ``take`` over an array whose elements are the spans and the gaps between them; others
    are sliced one by one.
    """
    count = len(starts)
    if count == 0:
        return pa.array([], BINARY)
    starts, stops = starts.astype(np.int64, copy=False), stops.astype(np.int64, copy=False)
    if present is not None and not present.all():  # a missing field: an empty span where the last one ended
        hole = np.concatenate(([0], np.maximum.accumulate(np.where(present, stops, 0))[:-1]))
        starts, stops = np.where(present, starts, hole), np.where(present, stops, hole)
    if not (stops >= starts).all() or not (starts[1:] >= stops[:-1]).all():
        return column([bytes(buffer[a:b]) if keep else None for a, b, keep in _spans(starts, stops, present)])
    bounds = np.empty(2 * count, np.int64)
    bounds[0::2], bounds[1::2] = starts, stops
    tiled = pa.LargeBinaryArray.from_buffers(
        BINARY, 2 * count - 1, [None, pa.py_buffer(bounds), pa.py_buffer(buffer)]
    )
    tiled.validate(full=True)  # offsets inside the buffer: a bad span must raise here, never read past it
    picks = pa.array(np.arange(0, 2 * count, 2), mask=None if present is None else ~present)
    return tiled.take(picks)


def texts(buffer: bytes | memoryview, starts: np.ndarray, stops: np.ndarray) -> list[str] | None:
    """The spans decoded as UTF-8 (keys), or ``None`` when one is not valid UTF-8 (the caller, decoding one
    by one, names it): gathered, checked and decoded in Arrow, no slice per span."""
    try:
        return list(gather(buffer, starts, stops).cast(pa.large_string()).to_pylist())
    except pa.ArrowInvalid:
        return None


def _spans(starts: np.ndarray, stops: np.ndarray, present: np.ndarray | None) -> zip[tuple[int, int, bool]]:
    keep = [True] * len(starts) if present is None else present.tolist()
    return zip(starts.tolist(), stops.tolist(), keep, strict=True)


def column(items: Sequence[bytes | None]) -> ByteColumn:
    """A column of ``items`` (``None`` for a missing field): for values that come one by one."""
    return pa.array(items, BINARY)


def values(col: ByteColumn) -> list[bytes | None]:
    """The column as one ``bytes`` (or ``None``) per sample: what the per-sample path hands out."""
    return list(col.to_pylist())


def concat(columns: Sequence[ByteColumn]) -> ByteColumn:
    return pa.concat_arrays(list(columns)) if columns else pa.array([], BINARY)


def take(col: ByteColumn, order: Sequence[int] | np.ndarray) -> ByteColumn:
    """The values at ``order``, gathered into a new column."""
    return col.take(pa.array(np.asarray(order, dtype=np.int64)))


def ragged(col: ByteColumn) -> tuple[bytes, np.ndarray]:
    """The column's values end to end, and the ``len + 1`` offsets into them (from 0); no nulls allowed."""
    offsets = np.frombuffer(col.buffers()[1], np.int64)[col.offset : col.offset + len(col) + 1]
    first, last = (int(offsets[0]), int(offsets[-1])) if len(offsets) else (0, 0)
    data = col.buffers()[2]
    return (data[first:last].to_pybytes() if data is not None else b""), offsets - first
