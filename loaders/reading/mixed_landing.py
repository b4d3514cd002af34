"""A mixture's window landed in one copy: every source's samples straight into the window's columns, in
the window's order, instead of each source into columns of its own and all of them again into that order.

Each source's part of the window is located through its own readers (``ShardReaders.locate``, any size);
the sizes of every sample's fields then give each landed field one buffer per piece of the window and each
sample its place in it, and each source lands its samples there (:func:`shardpipe.formats.landing.land`
with ``into``). Nothing is landed (the window is read source by source) where a source cannot be located
(a remote source read by ranges, a cached one under a budget), stores compressed fields, or holds records
of more than one layout.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial

import numpy as np

from loaders.planning.planner import Run
from loaders.reading.columns import Columns
from loaders.reading.readers import ShardReaders
from shardpipe.formats.bytecolumn import ByteColumn, packed
from shardpipe.formats.landing import Landing, Located, land, lands


@dataclass(frozen=True, slots=True)
class SourcePart:
    """One source's samples of a window: its ``runs`` (in its read order), and for each of its samples in
    the window's order, its position in that read order (``order``) and in the window (``positions``)."""

    source: int
    readers: ShardReaders
    runs: Sequence[Run]
    order: np.ndarray
    positions: np.ndarray
    shard_offset: int


def land_pieces(
    parts: Sequence[SourcePart], names: tuple[str, ...], size: int, bounds: Sequence[int]
) -> Iterator[Columns]:
    """The window's ``size`` samples, every source's at its positions, as columns that end at ``bounds``
    (ascending window positions, the last ``size``) where a field lands, else whole; nothing where the
    window cannot be landed (see the module). Each piece lands as the one before is taken, into the
    buffers its batches freed: a window of large samples is never copied out whole, as a source read
    alone lands a batch at a time (docs/design.md, "Reading")."""
    landings: list[Landing] = []
    for part in parts:
        landing = part.readers.locate(part.runs, names, any_size=True)
        if part.readers.codecs is not None or landing is None:
            return
        landings.append(landing)
    with ExitStack() as stack:
        located: list[Located] = []
        for landing, part in zip(landings, parts, strict=True):
            found = stack.enter_context(landing.located(part.order))
            if found is None:
                return
            located.append(found)
        starts = np.full((size, len(names)), -1, np.int64)  # (window, fields)
        stops = np.full((size, len(names)), -1, np.int64)
        for part, found in zip(parts, located, strict=True):
            starts[part.positions], stops[part.positions] = found.spans.starts, found.spans.stops
        landed = lands(starts, stops)
        window = _Window(parts, located, names, landed, stops - starts, *_provenance(parts, size))
        firsts = [0] * len(parts)  # each part's first sample not landed yet
        for begin, end in itertools.pairwise([0, *(bounds if landed.any() else [size])]):
            lasts = [int(np.searchsorted(part.positions, end)) for part in parts]
            yield window.piece(begin, end, list(zip(firsts, lasts, strict=True)))
            firsts = lasts


@dataclass(frozen=True, slots=True)
class _Window:
    """A window located and ready to land: its parts, which of ``names`` land, every sample's field sizes
    ``(window, fields)``, and its pads, shards and sources ``(window,)``."""

    parts: Sequence[SourcePart]
    located: Sequence[Located]
    names: tuple[str, ...]
    landed: np.ndarray
    sizes: np.ndarray
    pads: np.ndarray
    shards: np.ndarray
    sources: np.ndarray

    def piece(self, begin: int, end: int, ranges: Sequence[tuple[int, int]]) -> Columns:
        """Window positions ``begin..end``: samples ``ranges[i]`` of part i."""
        names, pool = self.names, self.parts[0].readers.landing_pool
        fields: dict[str, ByteColumn] = {}
        into = {}
        for j in np.flatnonzero(self.landed).tolist():
            sizes = self.sizes[begin:end, j]
            dest = pool.take(int(sizes.sum()))
            into[names[j]] = (dest.data, np.cumsum(sizes) - sizes)
            fields[names[j]] = packed(dest, sizes)
        landed_parts, positions = [], []
        for part, found, (first, last) in zip(self.parts, self.located, ranges, strict=True):
            if first == last:
                continue
            if begin:  # the first piece was checked as it was located
                found.check(first, last)
            at = part.positions[first:last] - begin
            mine = {name: (view, offsets[at]) for name, (view, offsets) in into.items()}
            locate = partial(_shifted, found.locate, first)
            spans = found.spans.sliced(first, last)
            landed_parts.append(land(spans, names, locate, landed=self.landed, pool=pool, into=mine))
            positions.append(at)
        # Every part's values end to end, then put in window order by one list comprehension per column.
        order = np.argsort(np.concatenate(positions), kind="stable").tolist()
        joined_keys = [key for part_keys, _ in landed_parts for key in part_keys]
        keys = [joined_keys[i] for i in order]
        for j in np.flatnonzero(~self.landed).tolist():
            joined = [value for _, part_fields in landed_parts for value in part_fields[names[j]]]
            fields[names[j]] = [joined[i] for i in order]
        columns = {name: fields[name] for name in names}
        window = slice(begin, end)
        return Columns(
            names,
            keys,
            columns,
            self.pads[window].tolist(),
            self.shards[window].tolist(),
            self.sources[window].tolist(),
        )


def _provenance(parts: Sequence[SourcePart], size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each window position's pad flag, shard (numbered across the sources) and source."""
    pads = np.empty(size, bool)
    shards = np.empty(size, np.int64)
    sources = np.empty(size, np.int64)
    for part in parts:
        lengths = [run.stop - run.start for run in part.runs]
        pads[part.positions] = np.repeat([bool(run.is_pad) for run in part.runs], lengths)[part.order]
        shards[part.positions] = np.repeat([run.shard_index for run in part.runs], lengths)[part.order]
        shards[part.positions] += part.shard_offset
        sources[part.positions] = part.source
    return pads, shards, sources


def _shifted(locate: Callable[[int], tuple[str, int]], first: int, i: int) -> tuple[str, int]:
    return locate(first + i)
