"""Reading samples straight into the columns their batches are cut from: one copy, every byte checked.

The read path of large samples, for which the copies are the cost (docs/design.md, "Reading"),
and of scattered ones (random access), for which a window's array work would be. Here a
sample's bytes are read where the page cache already holds them, with no copy of their own: through a
memory map of its shard file (tar, TFRecord) or as the view LMDB's map hands out. Its whole span is hashed
there in one call, which also brings it into the CPU cache, then each large field is copied out of the
cache into one buffer per field, end to end in the order asked for: a batch's column is a slice of that
buffer and is never copied again. Keys and small fields are copied out one by one (a few bytes each).

A format says where its samples lie (:class:`Spans`) and :func:`land` does the rest, for every format
alike. The checksum is compared before anything is returned, so a damaged sample never reaches a batch.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from shardpipe.errors import CorruptShardError
from shardpipe.formats.bytecolumn import ByteColumn, packed
from shardpipe.formats.checksums import checksum, first_mismatch
from shardpipe.formats.terms import ColumnsOut

LANDED_MIN_BYTES = 8192
"""A field lands in a buffer of its own when its values average at least this; smaller ones are copied out
one by one, which costs less than a column's fixed cost at these counts (docs/design.md, "Reading")."""
POOLED_BUFFERS = 8
"""Landing buffers a thread keeps for reuse (:class:`BufferPool`)."""
POOLED_BYTES = 64 << 20
"""Bytes of landing buffers a thread keeps for reuse: a window of large samples is landed whole (a mixture's,
random access) and may be far larger than a batch."""


class Landing(Protocol):
    """A window's samples, located once, landed a piece at a time (a piece ends where batches do)."""

    def land(self, order: np.ndarray, pool: BufferPool) -> ColumnsOut:
        """The samples at ``order`` (positions in the window's read order), in that order.

        Raises :class:`~shardpipe.errors.CorruptShardError` naming the shard and the sample.
        """

    def located(self, order: np.ndarray) -> AbstractContextManager[Located | None]:
        """Where the samples at ``order`` lie, valid while the context is open, for a caller that lands
        them into buffers of its own (:func:`land` with ``into``: a mixture's window); ``None`` where they
        cannot be landed (records that do not share one layout: :meth:`land` reads them another way)."""


@dataclass(frozen=True, slots=True)
class Located:
    """Samples ready to land: where they lie, ``locate(i)``, which names sample i (shard, index), and
    ``check(begin, end)``, which raises naming the first of samples ``begin..end`` that its file no longer
    holds (a memory-mapped file cut short since: a touch past its end is a fault), for a caller that
    lands them a piece at a time."""

    spans: Spans
    locate: Callable[[int], tuple[str, int]]
    check: Callable[[int, int], None] = lambda begin, end: None


class BufferPool:
    """Landing buffers, each leased to what is cut from it and returned when the last of that is gone.

    A fresh buffer of a few MiB comes from the kernel as zeroed pages, which costs a page fault and a
    write per 4 KiB before the copy writes it again; a buffer that was used before does not. A pooled
    buffer is handed out as a new array over its memory, the lease: every column, tensor, Arrow buffer
    or view cut from it refers to that array (NumPy views keep the array they were cut from as their
    base), so a finaliser on it returns the buffer exactly when nothing can read it any more. A batch a
    user keeps therefore keeps its buffer out of the pool, on any interpreter; nothing here counts
    references. One pool per thread (a lease may end in any thread).
    """

    def __init__(self, max_buffers: int = POOLED_BUFFERS, max_bytes: int = POOLED_BYTES) -> None:
        """The pool keeps at most ``max_buffers`` buffers of ``max_bytes`` in all."""
        self._buffers: list[np.ndarray] = []
        self._leased: set[int] = set()  # ids of the pooled buffers whose leases live
        self._max_buffers, self._max_bytes = max_buffers, max_bytes

    def take(self, size: int) -> np.ndarray:
        """``size`` bytes (uint8), not zeroed. An idle buffer of the smallest size that fits, of those the
        one taken last, the likeliest to be in the CPU cache still; buffers are made in powers of two, so
        that requests of about one size share them (a mixture's pieces vary). Idle buffers go first, least
        recently taken first, to make room within the pool's bounds; a buffer that would not fit is handed
        out unpooled (freed with its last column)."""
        buffers, most, most_bytes = self._buffers, self._max_buffers, self._max_bytes
        idle = [i for i in range(len(buffers)) if id(buffers[i]) not in self._leased]
        fitting = [i for i in idle if len(buffers[i]) >= size]
        if fitting:
            smallest = min(len(buffers[i]) for i in fitting)
            taken = max(i for i in fitting if len(buffers[i]) == smallest)
            buffers.append(buffers.pop(taken))  # kept in the order they were taken
            return self._lease(buffers[-1], size)
        made = _rounded(size) if _rounded(size) <= most_bytes else size
        for removed, i in enumerate(idle):
            if len(buffers) < most and sum(map(len, buffers)) + made <= most_bytes:
                break
            del buffers[i - removed]
        if len(buffers) >= most or sum(map(len, buffers)) + made > most_bytes:
            return np.empty(size, np.uint8)
        buffers.append(np.empty(made, np.uint8))
        return self._lease(buffers[-1], size)

    def _lease(self, buffer: np.ndarray, size: int) -> np.ndarray:
        """The first ``size`` bytes of a pooled ``buffer`` as a new array, the buffer leased until that
        array and everything cut from it are gone (a leased buffer stays in the pool, so its id is not
        reused meanwhile)."""
        key = id(buffer)
        self._leased.add(key)
        lease = np.frombuffer(buffer.data[:size], np.uint8)
        weakref.finalize(lease, self._leased.discard, key).atexit = False
        return lease


def _rounded(size: int) -> int:
    """``size`` rounded up to a power of two: the buffer's tail is never touched unless a larger request
    takes it, so the rounding costs address space, not memory."""
    return 1 << max(size - 1, 0).bit_length()


@dataclass(frozen=True, slots=True)
class Spans:
    """Where ``n`` samples lie, in the order they are handed out. Sample i lies in ``sources[i]`` (a memory
    map or a view of one): its checked bytes ``[begins[i], ends[i])``, whose xxh3_64 is ``checksums[i]``
    (``None``: not checked), its key ``[key_starts[i], key_stops[i])`` and field j ``[starts[i, j],
    stops[i, j])``, ``-1`` where the sample lacks it. Positions are int64, ``(n,)`` or ``(n, k)``."""

    sources: Sequence[memoryview]
    begins: np.ndarray
    ends: np.ndarray
    checksums: np.ndarray | None
    key_starts: np.ndarray
    key_stops: np.ndarray
    starts: np.ndarray
    stops: np.ndarray

    def sliced(self, begin: int, end: int) -> Spans:
        """Samples ``begin..end`` (views of these arrays, no copy)."""
        return Spans(
            self.sources[begin:end],
            self.begins[begin:end],
            self.ends[begin:end],
            None if self.checksums is None else self.checksums[begin:end],
            self.key_starts[begin:end],
            self.key_stops[begin:end],
            self.starts[begin:end],
            self.stops[begin:end],
        )


def lands(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """``(k,)``: which fields land in buffers of their own: present in every sample, and averaging
    ``LANDED_MIN_BYTES``."""
    present = (starts >= 0).all(axis=0)
    large = (stops - starts).sum(axis=0) >= LANDED_MIN_BYTES * max(len(starts), 1)
    result: np.ndarray = present & large
    return result


def land(
    spans: Spans,
    names: Sequence[str],
    landed: np.ndarray,
    pool: BufferPool,
    locate: Callable[[int], tuple[str, int]],
    into: Mapping[str, tuple[memoryview, np.ndarray]] | None = None,
) -> ColumnsOut:
    """The samples of ``spans`` as keys and a column per field of ``names``: fields where ``landed`` is set
    copied end to end into a buffer each, the others as one ``bytes`` per sample (``None`` where absent).
    ``locate(i)`` names sample i (its shard and index) in errors. A landed field named in ``into`` goes to
    the caller's buffer instead, sample i's value at byte ``at[i]`` of ``(buffer, at)``, and has no column
    here."""
    sources = spans.sources
    sizes = spans.stops - spans.starts  # (n, k)
    fields: dict[str, ByteColumn] = {}
    digest = checksum
    digests: list[int] | None = None
    for j in np.flatnonzero(landed).tolist():
        if into is not None and names[j] in into:
            view, at = into[names[j]]
        else:
            dest = pool.take(int(sizes[:, j].sum()))
            view, at = dest.data, np.cumsum(sizes[:, j]) - sizes[:, j]
            fields[names[j]] = packed(dest, sizes[:, j])
        starts, stops = spans.starts[:, j].tolist(), spans.stops[:, j].tolist()
        places = zip(sources, starts, stops, at.tolist(), strict=True)
        if digests is None and spans.checksums is not None:
            # The span hashed first, from the page cache; its field then copied from the CPU cache.
            digests = []
            for begin, end, (source, start, stop, to) in zip(
                spans.begins.tolist(), spans.ends.tolist(), places, strict=True
            ):
                digests.append(digest(source[begin:end]))
                view[to : to + stop - start] = source[start:stop]
        else:
            for source, start, stop, to in places:
                view[to : to + stop - start] = source[start:stop]
    if spans.checksums is not None:
        if digests is None:
            bad = first_mismatch(sources, spans.begins.tolist(), spans.ends.tolist(), spans.checksums)
        else:  # hashed while copying
            mismatched = np.flatnonzero(np.array(digests, np.uint64) != spans.checksums)
            bad = int(mismatched[0]) if len(mismatched) else None
        if bad is not None:
            shard, sample = locate(bad)
            detail, offset = "sample bytes differ from their checksum", int(spans.begins[bad])
            raise CorruptShardError.at(shard, detail, sample_index=sample, offset=offset)
    for j in np.flatnonzero(~landed).tolist():
        values = zip(sources, spans.starts[:, j].tolist(), spans.stops[:, j].tolist(), strict=True)
        fields[names[j]] = [source[a:z].tobytes() if a >= 0 else None for source, a, z in values]
    return _keys(spans, locate), {name: fields[name] for name in names if name in fields}


def columns_of(samples: list[dict[str, Any]], names: Sequence[str]) -> ColumnsOut:
    """Samples read one by one (dicts of fields and ``__key__``) as keys and a column per field of
    ``names`` (``None`` where a sample lacks it)."""
    keys = [sample.pop("__key__") for sample in samples]
    return keys, {name: [sample.get(name) for sample in samples] for name in names}


def _keys(spans: Spans, locate: Callable[[int], tuple[str, int]]) -> list[str]:
    """The keys, naming the first that is not UTF-8."""
    places = list(zip(spans.sources, spans.key_starts.tolist(), spans.key_stops.tolist(), strict=True))
    try:
        return [source[a:z].tobytes().decode() for source, a, z in places]
    except UnicodeDecodeError:
        pass
    keys = []
    for i, (source, a, z) in enumerate(places):
        try:
            keys.append(str(source[a:z], "utf-8"))
        except UnicodeDecodeError as exc:
            shard, sample = locate(i)
            raise CorruptShardError.at(shard, f"key is not UTF-8: {exc}", sample_index=sample) from None
    return keys
