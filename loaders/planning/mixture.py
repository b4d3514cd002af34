"""The mixture planner: which source fills each position of an epoch, and which sample. Pure: no I/O.

Rules:
1. Counts. An epoch's composition (``loaders.planning.weights.EpochMix``) gives each source its exact count
   per stage.
2. Schedule. Every prefix of p positions of a stage holds each source within one sample of its share:
   ``|c_s(p) - p * n_s / n| <= 1``, so any interval is within two. Where it is proved enough, source s's
   j-th sample takes the ideal time (j + 1/2) / n_s and positions follow ideal times (the stride order,
   vectorised); each source's count is then within 1/2 of threshold x n_s and their sum is p, so
   ``|c_s(p) - p * w_s| <= (1 + (k - 2) * w_s) / 2`` for k sources, within one when (k - 2) * max w <= 1
   (always for up to three sources). Otherwise the quota order (:func:`quota_schedule`, a Python loop)
   keeps ``floor(p * w_s) <= c_s(p) <= ceil(p * w_s)``. Exact ties go to the source ranked first by
   ``SeedSequence([seed, epoch, stage])``.
3. Sequence. The epoch's sequence is written as runs over one virtual shard per source: row
   ``(s, j0, j1)`` is source s's epoch samples j0..j1-1. A contiguous cut of the sequence (a rank's
   share, a worker's part, a window) therefore holds each source's samples as a contiguous stretch of j.
4. Cursors. Source s's epoch sample j is its global sample g = (its samples in all earlier epochs) + j;
   pass g // size, offset g % size into the pass's block order: the source's shards cut into blocks of
   ``block_size`` and permuted by ``SeedSequence([seed, SOURCE_STREAM, s, pass])`` (stored order without
   shuffle). No sample repeats within a pass; a contiguous stretch of g is a few long reads.
Nothing here depends on rank, worker, time or pid.

Layout 3 evaluates the same rules by range, never writing an epoch out (:class:`MixtureSequence`): the
schedule is :mod:`.schedule`'s tree of two-way splits (every prefix within one sample of each share for
up to three sources, within 1.68 for any number), and a pass's block order is a seeded bijection
over the source's stored order, every source of a window located at once: :class:`SourceTable`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from loaders.planning.elastic import Segment, rest_of
from loaders.planning.permutation import block_sources
from loaders.planning.planner import Runs, ShardSizes, cut_blocks, slice_rows
from loaders.planning.schedule import schedule_tree, sources_at
from loaders.planning.stream import RunsSequence, Samples, spans_of
from loaders.planning.weights import EpochMix

SOURCE_STREAM = 0x6D6978  # keeps a source's pass seeds apart from the epoch seeds of a single dataset


def stage_schedule(counts: Sequence[int], entropy: Sequence[int]) -> np.ndarray:
    """``(n,)`` source index of each position of one stage, in order (rule 2): the stride order where it is
    proved within one sample, the quota order otherwise."""
    counts = [int(c) for c in counts]
    total = sum(counts)
    if not total:
        return np.zeros(0, dtype=np.int64)
    ranks = np.random.default_rng(np.random.SeedSequence(list(entropy))).permutation(len(counts))
    if (len(counts) - 2) * max(counts) > total:
        return quota_schedule(counts, ranks.tolist())
    return stride_schedule(counts, ranks)


def stride_schedule(counts: list[int], ranks: np.ndarray) -> np.ndarray:
    """Positions in order of ideal time (j + 1/2) / n_s, ties to the lower rank (vectorised)."""
    source = np.repeat(np.arange(len(counts)), counts)  # (n,)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    j = np.arange(len(source)) - first  # (n,) index within its source
    ideal = (2 * j + 1) / (2 * np.asarray(counts, dtype=np.float64)[source])  # exact ties stay exact
    return source[np.lexsort((ranks[source], ideal))]


def quota_schedule(counts: list[int], ranks: list[int]) -> np.ndarray:
    """Earliest deadline first over windows that keep every prefix within quota: source s's j-th sample
    may not come before position floor(j n / n_s) (upper quota) and is due by ceil((j + 1) n / n_s) - 1
    (lower quota). A schedule meeting every window exists (house-monotone quota apportionment, Balinski
    and Young), and EDF finds one for unit jobs; ties go to the lower rank. One Python step a position."""
    total, k = sum(counts), len(counts)
    taken = [0] * k
    out = np.empty(total, dtype=np.int64)
    for position in range(total):
        best, best_key = -1, (total, k)
        for s in range(k):
            j, n = taken[s], counts[s]
            if j < n and j * total // n <= position:
                key = (-(-(j + 1) * total // n) - 1, ranks[s])
                if key < best_key:
                    best, best_key = s, key
        out[position] = best
        taken[best] += 1
    return out


def epoch_schedule(mix: EpochMix, seed: int, epoch: int) -> np.ndarray:
    """``(N,)`` source index of every position of the epoch."""
    parts = [stage_schedule(stage.counts, [seed, epoch, i]) for i, stage in enumerate(mix.stages)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def sequence_runs(schedule: np.ndarray, num_sources: int) -> Runs:
    """The schedule as runs over virtual source shards (rule 3): ``(n, 3)`` rows ``(s, j0, j1)``."""
    if len(schedule) == 0:
        return np.zeros((0, 3), dtype=np.int64)
    starts = np.flatnonzero(np.diff(schedule, prepend=-1))  # (rows,) first position of each row
    lengths = np.diff(np.append(starts, len(schedule)))
    sources = schedule[starts]
    j = np.zeros(len(starts), dtype=np.int64)
    for s in range(num_sources):  # j0 of a row: that source's positions before it
        mine = sources == s
        j[mine] = np.cumsum(lengths[mine]) - lengths[mine]
    return np.column_stack([sources, j, j + lengths]).astype(np.int64)


@lru_cache(maxsize=16)
def epoch_sequence(mix: EpochMix, seed: int, epoch: int) -> Runs:
    """A fresh epoch's sequence (rules 1-3); cached: every worker asks for it once per pass."""
    runs = sequence_runs(epoch_schedule(mix, seed, epoch), len(mix.stages[0].counts))
    runs.setflags(write=False)
    return runs


def first_cursors(mixes: Sequence[EpochMix], num_sources: int) -> tuple[int, ...]:
    """Each source's global cursor at the start of the epoch that follows ``mixes`` (earlier epochs)."""
    cursor = [0] * num_sources
    for mix in mixes:
        cursor = [c + n for c, n in zip(cursor, mix.counts, strict=True)]
    return tuple(cursor)


@lru_cache(maxsize=64)
def pass_blocks(
    shard_sizes: tuple[int, ...], block_size: int, shuffle: bool, entropy: tuple[int, ...]
) -> Runs:
    """One pass's block order of a source: ``(blocks, 3)`` rows ``(shard, start, stop)`` (rule 4)."""
    rows = np.array([[i, 0, n, 0] for i, n in enumerate(shard_sizes) if n > 0], dtype=np.int64).reshape(-1, 4)
    blocks = cut_blocks(rows, block_size)[:, :3]
    if shuffle:
        blocks = blocks[np.random.default_rng(np.random.SeedSequence(list(entropy))).permutation(len(blocks))]
    blocks.setflags(write=False)
    return blocks


def cursor_runs(
    shard_sizes: ShardSizes, block_size: int, shuffle: bool, seed: int, source: int, begin: int, end: int
) -> Runs:
    """The source's real ``(shard, start, stop)`` rows for global cursors [begin, end), in cursor order."""
    sizes = tuple(int(n) for n in shard_sizes)
    size = sum(sizes)
    if size == 0:
        raise ValueError(f"source {source} has no samples")
    pieces = [np.zeros((0, 3), dtype=np.int64)]
    while begin < end:
        number, offset = divmod(begin, size)
        stop = min(end - begin, size - offset) + offset
        blocks = pass_blocks(sizes, block_size, shuffle, (seed, SOURCE_STREAM, source, number))
        pieces.append(slice_rows(blocks, offset, stop))
        begin += stop - offset
    return np.concatenate(pieces)


def source_position(cursor: int, size: int) -> dict[str, int]:
    """Where a source stands at global cursor ``cursor``: its pass and the position in it."""
    number, offset = divmod(cursor, size)
    return {"pass": number, "position": offset}


class MixtureSequence:
    """A fresh epoch's sequence in layout 3: position -> ``(source, j)`` computed by range (rules 1-3)."""

    def __init__(self, mix: EpochMix, seed: int, epoch: int) -> None:
        self.trees = [schedule_tree(stage.counts, [seed, epoch, i]) for i, stage in enumerate(mix.stages)]
        sizes = [stage.num_samples for stage in mix.stages]
        self.starts = np.cumsum([0, *sizes])  # (stages + 1,) first position of each stage
        before = np.cumsum([[0] * len(mix.counts), *(stage.counts for stage in mix.stages)], axis=0)
        self.before = before.astype(np.int64)  # (stages + 1, sources) each source's samples before a stage
        self.size = int(self.starts[-1])

    def take(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions are walked as the contiguous stretches they form (a window is one or two)."""
        source = np.empty(len(positions), dtype=np.int64)
        j = np.empty(len(positions), dtype=np.int64)
        order = np.argsort(positions, kind="stable")
        ordered = positions[order]
        breaks = np.flatnonzero(np.diff(ordered) > 1) + 1
        for piece in np.split(np.arange(len(ordered)), breaks):
            if not len(piece):
                continue
            begin, end = int(ordered[piece[0]]), int(ordered[piece[-1]]) + 1
            found_source, found_j = self._range(begin, end)
            offset = ordered[piece] - begin
            source[order[piece]], j[order[piece]] = found_source[offset], found_j[offset]
        return source, j

    def _range(self, begin: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        sources, js = [], []
        first = int(np.searchsorted(self.starts, begin, side="right")) - 1
        for stage in range(first, len(self.trees)):
            low, high = max(begin, int(self.starts[stage])), min(end, int(self.starts[stage + 1]))
            if low >= end:
                break
            if low < high:
                source, j = sources_at(self.trees[stage], low - self.starts[stage], high - self.starts[stage])
                sources.append(source)
                js.append(j + self.before[stage][source])
        return np.concatenate(sources), np.concatenate(js)


def epoch_samples_of(mix: EpochMix, seed: int, epoch: int, layout: int) -> MixtureSequence | RunsSequence:
    """A fresh epoch's sequence in ``layout``: by range from layout 3, written out before."""
    if layout >= 3:
        return MixtureSequence(mix, seed, epoch)
    return RunsSequence(epoch_sequence(mix, seed, epoch))


@lru_cache(maxsize=8)
def remaining_samples(
    mix: EpochMix, seed: int, history: tuple[Segment, ...], epoch: int, layout: int
) -> Samples:
    """What a pass of ``epoch`` reads after the segments of ``history`` (kept for the last few passes:
    ``len`` and the pass both ask for it)."""
    return rest_of(epoch_samples_of(mix, seed, epoch, layout), mix.counts, history, epoch)


def continued_origin(
    state: Mapping[str, Any], names: Sequence[str], sizes: Sequence[int]
) -> tuple[int, tuple[int, ...]]:
    """The epoch after a saved run's (``state``), and each source's global cursor there, as if the saved
    epoch had been read whole: where a changed mix continues the sources' passes."""
    try:
        epoch = int(state["epoch"])
        start = [
            state["sources"][n]["pass"] * size + state["sources"][n]["position"]
            for n, size in zip(names, sizes, strict=True)
        ]
        drawn = [sum(stage[1 + s] for stage in state["mix"]) for s in range(len(names))]
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"cannot continue: the saved state holds no mixture position ({exc!r})") from exc
    return epoch + 1, tuple(a + b for a, b in zip(start, drawn, strict=True))


@dataclass(frozen=True)
class SourceTable:
    """Every source's shards as one table, so that a window's samples of all its sources are located in
    one vectorised pass (rule 4 in layout 3): source s's pass p is its stored order in blocks of
    ``block_sizes[s]`` permuted by a seeded bijection keyed by ``(seed, SOURCE_STREAM, s, p)``."""

    sizes: np.ndarray  # (k,) samples of each source
    bases: np.ndarray  # (k,) each source's first position in the joined stored order
    ends: np.ndarray  # every source's shard ends, in source order, in the joined stored order
    first_shards: np.ndarray  # (k,) each source's first shard in ``ends``
    block_sizes: np.ndarray  # (k,)
    shuffle: bool
    seed: int

    @classmethod
    def of(
        cls, shard_sizes: Sequence[ShardSizes], block_sizes: Sequence[int], shuffle: bool, seed: int
    ) -> SourceTable:
        tables = [np.asarray(sizes, dtype=np.int64).reshape(-1) for sizes in shard_sizes]
        sizes = np.array([int(t.sum()) for t in tables], dtype=np.int64)
        if np.any(sizes == 0):
            raise ValueError(f"source {int(np.argmax(sizes == 0))} has no samples")
        return cls(
            sizes=sizes,
            bases=np.cumsum(sizes) - sizes,
            ends=np.cumsum(np.concatenate([np.zeros(0, np.int64), *tables])),
            first_shards=np.cumsum([len(t) for t in tables]) - [len(t) for t in tables],
            block_sizes=np.asarray(block_sizes, dtype=np.int64),
            shuffle=shuffle,
            seed=seed,
        )

    def locate(self, source: np.ndarray, cursor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, sample)`` of each ``(source, global cursor)``, the shard counted within its source."""
        number, offset = np.divmod(cursor, self.sizes[source])
        stored = offset
        if self.shuffle and len(cursor):
            passes, which = np.unique((source << 32) | number, return_inverse=True)
            groups = [(p >> 32, p & 0xFFFFFFFF) for p in passes.tolist()]
            stored = block_sources(
                offset,
                which.reshape(-1),
                [int(self.sizes[s]) for s, _ in groups],
                [int(self.block_sizes[s]) for s, _ in groups],
                [(self.seed, SOURCE_STREAM, s, p) for s, p in groups],
            )
        where = self.bases[source] + stored
        shard = np.searchsorted(self.ends, where, side="right")
        start = np.where(shard > 0, self.ends[shard - 1], 0)
        return shard - self.first_shards[source], where - start

    def rows(self, source: int, begin: int, end: int) -> Runs:
        """Source ``source``'s ``(shard, start, stop)`` rows for its global cursors [begin, end)."""
        cursor = np.arange(begin, end, dtype=np.int64)
        shard, sample = self.locate(np.full(len(cursor), source, dtype=np.int64), cursor)
        return spans_of(shard, sample, np.zeros_like(shard), shuffle=False)[:, :3]
