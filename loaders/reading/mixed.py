"""How a mixture's window is read: its virtual rows ``(source, j0, j1, is_pad)`` grouped by source (each
source read in one call, through its own readers), and the order that puts the samples back."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from loaders.planning.planner import Run


def read_order(runs: Sequence[Run]) -> np.ndarray:
    """``(n,)`` for each sample of the window in read order, its index in the by-source grouping that
    ``Mixture`` reads (sources in order of first appearance, each source's rows in order)."""
    firsts = list(dict.fromkeys(run.shard_index for run in runs))
    totals = dict.fromkeys(firsts, 0)
    for run in runs:
        totals[run.shard_index] += run.stop - run.start
    base, offset = {}, 0
    for source in firsts:
        base[source], offset = offset, offset + totals[source]
    pieces = [np.zeros(0, dtype=np.int64)]
    for run in runs:
        start = base[run.shard_index]
        pieces.append(np.arange(start, start + run.stop - run.start))
        base[run.shard_index] += run.stop - run.start
    return np.concatenate(pieces)


def by_source(runs: Sequence[Run]) -> dict[int, list[Run]]:
    """The window's virtual rows grouped by source in order, each group's contiguous rows joined."""
    groups: dict[int, list[Run]] = {}
    for run in runs:
        rows = groups.setdefault(run.shard_index, [])
        if rows and rows[-1].stop == run.start and rows[-1].is_pad == run.is_pad:
            rows[-1] = rows[-1]._replace(stop=run.stop)
        else:
            rows.append(run)
    return groups
