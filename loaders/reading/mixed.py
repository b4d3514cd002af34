"""How a mixture's window is read: its virtual rows ``(source, j0, j1, is_pad)`` grouped by source (each
source read in one call, through its own readers), and the order that puts the samples back. Vectorised:
a mixture's window holds a row for nearly every sample."""

from __future__ import annotations

import numpy as np

from loaders.planning.planner import Blocks


def read_order(rows: Blocks) -> np.ndarray:
    """``(n,)`` for each sample of the window in read order, its index in the by-source grouping that
    ``Mixture`` reads (sources in order of first appearance, each source's rows in order)."""
    lengths = rows[:, 2] - rows[:, 1]
    grouped = np.argsort(_appearance(rows[:, 0]), kind="stable")  # (rows,) the rows in grouping order
    starts = np.empty(len(rows), dtype=np.int64)  # (rows,) each row's first index in the grouping
    starts[grouped] = np.cumsum(lengths[grouped]) - lengths[grouped]
    read_starts = np.cumsum(lengths) - lengths
    return np.repeat(starts - read_starts, lengths) + np.arange(int(lengths.sum()))


def by_source(rows: Blocks) -> dict[int, Blocks]:
    """The window's virtual rows grouped by source in order of first appearance, each group's rows in
    order with contiguous rows of the same padding joined: ``source -> (m, 4)`` rows."""
    if not len(rows):
        return {}
    grouped = rows[np.argsort(_appearance(rows[:, 0]), kind="stable")]
    follows = np.zeros(len(grouped), dtype=bool)  # (rows,) whether a row continues the one before it
    follows[1:] = (
        (grouped[1:, 0] == grouped[:-1, 0])
        & (grouped[1:, 1] == grouped[:-1, 2])
        & (grouped[1:, 3] == grouped[:-1, 3])
    )
    firsts = np.flatnonzero(~follows)
    lasts = np.append(firsts[1:], len(grouped)) - 1
    joined = grouped[firsts].copy()
    joined[:, 2] = grouped[lasts, 2]
    return {int(source): joined[joined[:, 0] == source] for source in dict.fromkeys(joined[:, 0].tolist())}


def _appearance(sources: np.ndarray) -> np.ndarray:
    """``(rows,)`` each row's source ranked by its first appearance in the window."""
    values, firsts, inverse = np.unique(sources, return_index=True, return_inverse=True)
    rank = np.empty(len(values), dtype=np.int64)
    rank[np.argsort(firsts)] = np.arange(len(values))
    return rank[inverse]
