"""The one kernel that turns located samples into columns: every span hashed once, every field copied once.

A format says where a window's samples lie (:class:`Spans`, from its index or its records) and
:func:`land` does the rest, for every format alike (docs/design.md, "Reading"). Samples lie either where
the page cache holds them, with no copy of their own (a memory map of a tar or TFRecord shard, the view
LMDB's map hands out: large samples, for which the copies are the cost), or end to end in one buffer
their runs were read into (small ones, for which the cost is per sample and per call). Each span is hashed
in one call; large fields are then copied out of the CPU cache into one buffer per field, end to end in
the order asked for, so a batch's column is a slice of that buffer and is never copied again. Small fields
and keys in one buffer are gathered in one vectorised take each, picking the window's order as they copy;
those of samples that lie apart are copied out one by one (a few bytes each). The checksum is compared
before anything is returned, so a damaged sample never reaches a batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from shardpipe.errors import CorruptShardError
from shardpipe.formats.bytecolumn import ByteColumn, gather, packed, texts
from shardpipe.formats.checksums import agrees, first_mismatch
from shardpipe.formats.leases import BufferPool
from shardpipe.formats.terms import ColumnsOut

LANDED_MIN_BYTES = 8192
"""A field lands in a buffer of its own when its values average at least this; smaller ones are copied out
one by one, which costs less than a column's fixed cost at these counts (docs/design.md, "Reading")."""


class Landing(Protocol):
    """A window's samples, located once, landed whole or a piece at a time (a piece ends where batches do)."""

    in_pieces: bool
    """Whether landing it a piece at a time pays: its large fields land in buffers that batches are slices
    of (a window of small samples is gathered whole, one call per field)."""

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


@dataclass(frozen=True, slots=True)
class Spans:
    """Where ``n`` samples lie: in ``sources`` when that is one view (a buffer that holds them all), else
    sample i in ``sources[i]`` (a memory map or a view of one). Sample i's checked bytes are ``[begins[i],
    ends[i])``, whose xxh3_64 is ``checksums[i]`` (``None``: not checked), its key ``[key_starts[i],
    key_stops[i])`` and field j ``[starts[i, j], stops[i, j])``, ``-1`` where the sample lacks it.
    Positions are int64, ``(n,)`` or ``(n, k)``; ``in_file``: they are byte offsets in the sample's shard
    file (an error names the byte), not in a buffer or record."""

    sources: memoryview | Sequence[memoryview]
    begins: np.ndarray
    ends: np.ndarray
    checksums: np.ndarray | None
    key_starts: np.ndarray
    key_stops: np.ndarray
    starts: np.ndarray
    stops: np.ndarray
    in_file: bool = True

    @property
    def buffer(self) -> memoryview | None:
        """The one buffer that holds every sample, if one does."""
        return self.sources if isinstance(self.sources, memoryview) else None

    def each(self) -> Sequence[memoryview]:
        """Each sample's source."""
        sources = self.sources
        return [sources] * len(self.begins) if isinstance(sources, memoryview) else sources

    def sliced(self, begin: int, end: int) -> Spans:
        """Samples ``begin..end`` (views of these arrays, no copy)."""
        sources = self.sources
        return self._picked(
            slice(begin, end), sources if isinstance(sources, memoryview) else sources[begin:end]
        )

    def taken(self, order: np.ndarray) -> Spans:
        """The samples at ``order``, in that order."""
        sources = self.sources
        if not isinstance(sources, memoryview):
            sources = [sources[i] for i in order.tolist()]
        return self._picked(order, sources)

    def _picked(self, at: slice | np.ndarray, sources: memoryview | Sequence[memoryview]) -> Spans:
        checksums = None if self.checksums is None else self.checksums[at]
        return Spans(
            sources,
            self.begins[at],
            self.ends[at],
            checksums,
            self.key_starts[at],
            self.key_stops[at],
            self.starts[at],
            self.stops[at],
            self.in_file,
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
    locate: Callable[[int], tuple[str, int]],
    *,
    order: np.ndarray | None = None,
    landed: np.ndarray | None = None,
    pool: BufferPool | None = None,
    into: Mapping[str, tuple[memoryview, np.ndarray]] | None = None,
) -> ColumnsOut:
    """The samples of ``spans`` at ``order`` (all in turn when ``None``) as keys and a column per field of
    ``names``, every sample of ``spans`` checked (what was read, picked or not): fields where ``landed`` is
    set copied end to end into a buffer each from ``pool``, the others gathered (``None`` where a sample
    lacks one). ``locate(i)`` names sample i of ``spans`` (its shard and index) in errors. A landed field
    named in ``into`` goes to the caller's buffer instead, sample i's value at byte ``at[i]`` of ``(buffer,
    at)``, and has no column here.

    Raises :class:`~shardpipe.errors.CorruptShardError` naming the shard and the sample.
    """
    picked = functools.cache(lambda: spans if order is None else spans.taken(order))  # where it is needed
    fields: dict[str, ByteColumn] = {}
    checksums, bad = spans.checksums, None  # every sample of spans, picked or not: what was read is checked
    if landed is not None and landed.any():
        assert pool is not None, "landed fields need a pool"
        bad = _land_fields(picked(), names, landed, pool, into, fields, order is None)
        checksums = None if order is None else checksums  # all were copied, so checked
    if checksums is not None:
        bad = first_mismatch(spans.sources, spans.begins.tolist(), spans.ends.tolist(), checksums)
    if bad is not None:
        shard, sample = locate(bad)
        offset = int(spans.begins[bad]) if spans.in_file else None
        detail = "sample bytes differ from their checksum"
        raise CorruptShardError.at(shard, detail, sample_index=sample, offset=offset)
    for j in range(len(names)) if landed is None else np.flatnonzero(~landed).tolist():
        fields[names[j]] = _gathered(spans, picked, j, order)
    named = locate if order is None else (lambda i: locate(order.item(i)))
    return _keys(spans, picked, order, named), {name: fields[name] for name in names if name in fields}


def _land_fields(
    spans: Spans,
    names: Sequence[str],
    landed: np.ndarray,
    pool: BufferPool,
    into: Mapping[str, tuple[memoryview, np.ndarray]] | None,
    fields: dict[str, ByteColumn],
    check: bool,
) -> int | None:
    """Copy each landed field of ``spans`` (in their order) end to end into a buffer of its own, adding
    its column to ``fields`` (or into the caller's buffer, ``into``). With ``check`` (and checksums), each
    sample is checked from the page cache as its first field is copied, which then reads the CPU cache;
    the first that differs stops the copies and is returned."""
    sources = spans.each()
    sizes = spans.stops - spans.starts  # (n, k)
    agree, checksums = agrees, spans.checksums if check else None
    for j in np.flatnonzero(landed).tolist():
        if into is not None and names[j] in into:
            view, at = into[names[j]]
        else:
            dest = pool.take(int(sizes[:, j].sum()))
            view, at = dest.data, np.cumsum(sizes[:, j]) - sizes[:, j]
            fields[names[j]] = packed(dest, sizes[:, j])
        starts, stops = spans.starts[:, j].tolist(), spans.stops[:, j].tolist()
        places = zip(sources, starts, stops, at.tolist(), strict=True)
        if checksums is not None:  # with the first landed field
            checks = zip(spans.begins.tolist(), spans.ends.tolist(), checksums.tolist(), strict=True)
            for i, ((begin, end, expected), (source, start, stop, to)) in enumerate(
                zip(checks, places, strict=True)
            ):
                if not agree(source[begin:end], expected):
                    return i
                view[to : to + stop - start] = source[start:stop]
            checksums = None
        else:
            for source, start, stop, to in places:
                view[to : to + stop - start] = source[start:stop]
    return None


def _gathered(spans: Spans, picked: Callable[[], Spans], j: int, order: np.ndarray | None) -> ByteColumn:
    """Field j of the samples ``picked()`` (``spans`` at ``order``): in one take where one buffer holds
    them, else one ``bytes`` per sample."""
    if (buffer := spans.buffer) is not None:
        starts, stops = spans.starts[:, j], spans.stops[:, j]
        present = starts >= 0
        return gather(buffer, starts, stops, None if present.all() else present, order)
    taken = picked()
    values = zip(taken.each(), taken.starts[:, j].tolist(), taken.stops[:, j].tolist(), strict=True)
    return [source[a:z].tobytes() if a >= 0 else None for source, a, z in values]


def columns_of(samples: list[dict[str, Any]], names: Sequence[str]) -> ColumnsOut:
    """Samples read one by one (dicts of fields and ``__key__``) as keys and a column per field of
    ``names`` (``None`` where a sample lacks it)."""
    keys = [sample.pop("__key__") for sample in samples]
    return keys, {name: [sample.get(name) for sample in samples] for name in names}


def _keys(
    spans: Spans,
    picked: Callable[[], Spans],
    order: np.ndarray | None,
    locate: Callable[[int], tuple[str, int]],
) -> list[str]:
    """The keys of ``picked()`` (``spans`` at ``order``), naming the first that is not UTF-8
    (``locate(i)`` names sample i of ``picked()``)."""
    buffer = spans.buffer
    if buffer is not None and (keys := texts(buffer, spans.key_starts, spans.key_stops, order)):
        return keys
    taken = picked()
    places = list(zip(taken.each(), taken.key_starts.tolist(), taken.key_stops.tolist(), strict=True))
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
