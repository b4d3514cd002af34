"""A mixture's window landed in one copy: every source's samples straight into the window's columns, in
the window's order, instead of each source into columns of its own and all of them again into that order.

Each source's part of the window is located through its own readers (``ShardReaders.locate``, any size);
the sizes of every sample's fields then give each landed field one buffer and each sample its place in it,
and each source lands its samples there (:func:`shardpipe.formats.landing.land` with ``into``). ``None``
(read the window source by source) where a source cannot be located (a remote source read by ranges, a
cached one under a budget), stores compressed fields, or holds records of more than one layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass

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


def land_window(parts: Sequence[SourcePart], names: tuple[str, ...], size: int) -> Columns | None:
    """The window's ``size`` samples, every source's at its positions, or ``None`` (see the module)."""
    landings: list[Landing] = []
    for part in parts:
        landing = part.readers.locate(part.runs, names, any_size=True)
        if part.readers.codecs is not None or landing is None:
            return None
        landings.append(landing)
    pool = parts[0].readers.landing_pool
    with ExitStack() as stack:
        located: list[Located] = []
        for landing, part in zip(landings, parts, strict=True):
            found = stack.enter_context(landing.located(part.order))
            if found is None:
                return None
            located.append(found)
        starts = np.full((size, len(names)), -1, np.int64)  # (window, fields)
        stops = np.full((size, len(names)), -1, np.int64)
        for part, found in zip(parts, located, strict=True):
            starts[part.positions], stops[part.positions] = found.spans.starts, found.spans.stops
        landed, sizes = lands(starts, stops), stops - starts
        fields: dict[str, ByteColumn] = {}
        into = {}
        for j in np.flatnonzero(landed).tolist():
            dest = pool.take(int(sizes[:, j].sum()))
            into[names[j]] = (dest.data, np.cumsum(sizes[:, j]) - sizes[:, j])
            fields[names[j]] = packed(dest, sizes[:, j])
        landed_parts = []
        for part, found in zip(parts, located, strict=True):
            mine = {name: (view, at[part.positions]) for name, (view, at) in into.items()}
            landed_parts.append(land(found.spans, names, landed, pool, found.locate, mine))
    # Every part's values end to end, then put in window order by one list comprehension per column.
    window_order = np.argsort(np.concatenate([part.positions for part in parts]), kind="stable").tolist()
    joined_keys = [key for part_keys, _ in landed_parts for key in part_keys]
    keys = [joined_keys[i] for i in window_order]
    for j in np.flatnonzero(~landed).tolist():
        joined = [value for _, part_fields in landed_parts for value in part_fields[names[j]]]
        fields[names[j]] = [joined[i] for i in window_order]
    pads = np.empty(size, bool)
    shards = np.empty(size, np.int64)
    sources = np.empty(size, np.int64)
    for part in parts:
        lengths = [run.stop - run.start for run in part.runs]
        pads[part.positions] = np.repeat([bool(run.is_pad) for run in part.runs], lengths)[part.order]
        shards[part.positions] = np.repeat([run.shard_index for run in part.runs], lengths)[part.order]
        shards[part.positions] += part.shard_offset
        sources[part.positions] = part.source
    columns = {name: fields[name] for name in names}
    return Columns(names, keys, columns, pads.tolist(), shards.tolist(), sources.tolist())
