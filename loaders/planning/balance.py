"""Per-batch composition for a mixture: a rank's stream reordered so each batch holds every source in
proportion. Pure: no I/O.

The stream's rows are ``(source, j0, j1, is_pad)`` (a mixture's virtual shards are its sources). It is cut
into batches of ``batch_size`` (the last may be shorter); batch m takes b[m, s] samples of source s, the
next ones of that source in stream order (so each source is still read as a contiguous stretch), where
b[m, s] is floor(x) of x = size_m x c_s / L plus one for the sources furthest behind their cumulative
share (c_s: the source's samples in the stream, L: the stream's length). Inside a batch the samples are
grouped by source (the window permutation, one window per batch, mixes them).
"""

from __future__ import annotations

import numpy as np


def batch_counts(totals: list[int], batch_size: int) -> list[list[int]]:
    """``counts[m][s]``: samples of source s in batch m; rows sum to the batch sizes, columns to totals."""
    length = sum(totals)
    left = list(totals)
    given = [0] * len(totals)
    out: list[list[int]] = []
    for begin in range(0, length, batch_size):
        size = min(batch_size, length - begin)
        end = begin + size
        counts = [min(size * c // length, r) for c, r in zip(totals, left, strict=True)]
        while sum(counts) < size:  # one more to the sources furthest behind their share at the batch's end
            behind = sorted(
                (s for s in range(len(totals)) if counts[s] < left[s]),
                key=lambda s: (-(end * totals[s] - length * (given[s] + counts[s])), s),
            )
            for s in behind[: size - sum(counts)]:
                counts[s] += 1
        for s, n in enumerate(counts):
            given[s] += n
            left[s] -= n
        out.append(counts)
    return out


def balanced_order(source: np.ndarray, batch_size: int) -> np.ndarray:
    """``(L,)`` the stream positions in their new order, given each position's source."""
    if len(source) == 0:
        return np.zeros(0, dtype=np.int64)
    num_sources = int(source.max()) + 1
    members = [np.flatnonzero(source == s) for s in range(num_sources)]  # each source's samples in order
    given = [0] * num_sources
    order = []
    for counts in batch_counts([len(m) for m in members], batch_size):
        for s, n in enumerate(counts):
            order.append(members[s][given[s] : given[s] + n])
            given[s] += n
    return np.concatenate(order).astype(np.int64)


def balanced_batches(rows: np.ndarray, batch_size: int) -> np.ndarray:
    """``rows`` reordered batch by batch as the module says: ``(n, 4)`` rows in the new stream order."""
    if len(rows) == 0:
        return rows
    lengths = rows[:, 2] - rows[:, 1]
    owner = np.repeat(np.arange(len(rows)), lengths)  # (L,) row of each sample
    j = rows[owner, 1] + np.arange(len(owner)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    source = rows[owner, 0]
    picked = balanced_order(source, batch_size)  # (L,) stream index of each sample in the new order
    src, jj, pad = source[picked], j[picked], rows[owner[picked], 3]
    new_row = np.ones(len(picked), dtype=bool)
    new_row[1:] = (src[1:] != src[:-1]) | (pad[1:] != pad[:-1]) | (jj[1:] != jj[:-1] + 1)
    starts = np.flatnonzero(new_row)
    ends = np.append(starts[1:], len(picked))
    return np.column_stack([src[starts], jj[starts], jj[ends - 1] + 1, pad[starts]]).astype(np.int64)
