"""Resume an interrupted epoch on another world size, worker count or batch size. Pure: no I/O.

A run saved mid-epoch had consumed, on every rank, the same number of batches of one plan: a ``Segment``
(the plan's config and that count). Which samples those were is a function of the segment alone: worker
w of every rank had handed out the first ``consumed_count`` samples of its yield order. The rest of the
epoch is the epoch's sequence minus those samples, in the same order (``remaining_runs``). A resumed run
plans that rest like a fresh sequence with its own config (``loaders.planning.planner``), so every new rank
again runs the same number of steps, and over the epoch each sample is read once, plus the flagged pads (or
minus the drops) of each segment. A run resized twice in one epoch folds its segments in order.

Layout 3 (:func:`epoch_samples`) never writes the rest out: :class:`RestSequence` finds its positions on
demand, as the fresh epoch's sequence does. Layouts 1 and 2 (states saved before it) subtract runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loaders.planning.planner import (
    LAZY_LAYOUT,
    PlanConfig,
    Runs,
    ShardSizes,
    epoch_runs,
    num_samples,
    samples_per_rank,
    slice_rows,
    window_permutation,
    window_rows,
    window_seed,
    worker_part,
    worker_sample_counts,
)
from loaders.planning.stream import RankStream, RunsSequence, Samples, ShardSequence, reading_order


@dataclass(frozen=True, slots=True)
class Segment:
    """``batches`` batches consumed on every rank of a run planned with ``config``."""

    config: PlanConfig
    batches: int

    def __post_init__(self) -> None:
        if isinstance(self.batches, bool) or not isinstance(self.batches, int) or self.batches < 0:
            raise ValueError(f"batches must be an int >= 0, got {self.batches!r}")


def consumed_count(config: PlanConfig, per_rank: int, worker_index: int, batches: int) -> int:
    """Samples worker ``worker_index`` had handed out after ``batches`` batches of its rank.

    The DataLoader takes batches from workers round-robin, and each worker's part is whole batches.
    """
    readers = config.num_readers
    own = batches // readers + (worker_index < batches % readers)
    counts = worker_sample_counts(per_rank, config.num_workers, config.batch_size)
    return min(counts[worker_index], own * config.batch_size)


def consumed_runs(runs: Runs, segment: Segment, epoch: int) -> Runs:
    """The real (non-pad) samples ``segment`` consumed from the sequence ``runs``: ``(n, 3)`` rows."""
    config = segment.config
    per_rank = samples_per_rank(num_samples(runs), config.world_size, config.remainder)
    window = config.shuffle_buffer
    taken = [np.zeros((0, 3), dtype=np.int64)]
    for rank in range(config.world_size):
        for worker in range(config.num_readers):
            count = consumed_count(config, per_rank, worker, segment.batches)
            part = worker_part(runs, config, epoch=epoch, rank=rank, worker_index=worker)
            whole = count // window * window  # samples of the windows handed out completely
            taken.append(_real(slice_rows(part, 0, whole)))
            if count > whole:  # the window being handed out: its first samples in yield order
                rows = window_rows(part, whole, min(whole + window, num_samples(part)), config.shuffle)
                samples = _expand(rows)  # (window, 3) shard, sample, is_pad in read order
                seed = window_seed(config, epoch, rank, worker, whole // window)
                first = samples[window_permutation(seed, len(samples))[: count - whole]]
                first = first[first[:, 2] == 0]
                taken.append(np.column_stack([first[:, 0], first[:, 1], first[:, 1] + 1]))
    return np.concatenate(taken)


def remaining_runs(shard_sizes: Sequence[int], history: Sequence[Segment], epoch: int) -> Runs:
    """The epoch's sequence left after the segments of ``history``, in the epoch's order."""
    if not history:
        raise ValueError("history must hold at least one segment")
    return remaining_of(epoch_runs(shard_sizes, history[0].config, epoch), shard_sizes, history, epoch)


def remaining_of(runs: Runs, shard_sizes: ShardSizes, history: Sequence[Segment], epoch: int) -> Runs:
    """The sequence ``runs`` (each sample of ``shard_sizes`` at most once) left after ``history``: what a
    mixture, whose sequence is not a shard order, resumes from."""
    offsets = np.concatenate([[0], np.cumsum(np.asarray(shard_sizes, dtype=np.int64))])
    for segment in history:
        runs = _subtract(runs, consumed_runs(runs, segment, epoch), offsets)
    return runs


def _real(rows: np.ndarray) -> Runs:
    return rows[rows[:, 3] == 0, :3]


def _expand(rows: np.ndarray) -> np.ndarray:
    """Block rows -> one ``(shard, sample, is_pad)`` row per sample, in order."""
    lengths = rows[:, 2] - rows[:, 1]
    owner = np.repeat(np.arange(len(rows)), lengths)
    sample = rows[owner, 1] + np.arange(len(owner)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.column_stack([rows[owner, 0], sample, rows[owner, 3]])


def _subtract(runs: Runs, taken: Runs, offsets: np.ndarray) -> Runs:
    """``runs`` without the samples in ``taken`` (disjoint rows), in the order of ``runs``.

    Works on global sample ids (``offsets[shard] + sample``): every boundary of either set cuts the ids
    into pieces; a piece is kept when it lies in a run and not in ``taken``.
    """
    starts, stops = offsets[runs[:, 0]] + runs[:, 1], offsets[runs[:, 0]] + runs[:, 2]
    taken_starts = offsets[taken[:, 0]] + taken[:, 1]
    taken_stops = offsets[taken[:, 0]] + taken[:, 2]
    points = np.unique(np.concatenate([starts, stops, taken_starts, taken_stops]))
    lows, highs = points[:-1], points[1:]  # (pieces,)
    by_start = np.argsort(starts)
    run = np.searchsorted(starts[by_start], lows, side="right") - 1
    in_run = (run >= 0) & (lows < stops[by_start][np.maximum(run, 0)])
    in_taken = np.zeros(len(lows), dtype=bool)
    if len(taken):
        order = np.argsort(taken_starts)
        hit = np.searchsorted(taken_starts[order], lows, side="right") - 1
        in_taken = (hit >= 0) & (lows < taken_stops[order][np.maximum(hit, 0)])
    keep = in_run & ~in_taken
    run_index, lows, highs = by_start[run[keep]], lows[keep], highs[keep]
    order = np.lexsort((lows, run_index))  # back to the sequence's order
    run_index, lows, highs = run_index[order], lows[order], highs[order]
    joined = np.ones(len(lows), dtype=bool)  # merge pieces that continue the previous one
    joined[1:] = (run_index[1:] != run_index[:-1]) | (lows[1:] != highs[:-1])
    groups = np.flatnonzero(joined)
    shard = runs[run_index[groups], 0]
    out = np.column_stack([shard, lows[groups], np.append(highs[groups[1:] - 1], highs[-1:])])
    out[:, 1:] -= offsets[shard][:, None]
    return out.astype(np.int64)


def epoch_samples(
    shard_sizes: ShardSizes, config: PlanConfig, history: Sequence[Segment], epoch: int
) -> Samples:
    """The sequence a pass of ``epoch`` plans over: the fresh epoch's (laid out as the first segment's
    plan, or ``config``'s without one) less what each segment of ``history`` consumed, in order."""
    first = history[0].config if history else config
    if first.layout >= LAZY_LAYOUT:
        return rest_of(ShardSequence(shard_sizes, first, epoch), shard_sizes, history, epoch)
    return rest_of(RunsSequence(epoch_runs(shard_sizes, first, epoch)), shard_sizes, history, epoch)


def rest_of(sequence: Samples, shard_sizes: ShardSizes, history: Sequence[Segment], epoch: int) -> Samples:
    """``sequence`` less what each segment of ``history`` consumed: lazily for layout-3 segments, as runs
    for older ones (which only ever come first: a resumed run plans with the newest layout)."""
    for segment in history:
        if segment.config.layout >= LAZY_LAYOUT:
            sequence = RestSequence(sequence, segment.config, epoch, segment.batches)
        elif isinstance(sequence, RunsSequence):
            sequence = RunsSequence(remaining_of(sequence.runs, shard_sizes, [segment], epoch))
        else:
            raise ValueError(f"a layout-{segment.config.layout} segment cannot follow a layout-3 one")
    return sequence


class RestSequence:
    """What a layout-3 segment (``batches`` batches of ``config`` on every rank) left of ``sequence``.

    In order: for each rank, for each worker, the unread stretch of its part of the rank's stream, less
    the samples its current window had handed out (the window's permutation decides which) and less the
    rank's pads; then the tail the plan dropped. Positions are found through prefix sums over those
    pieces and a sorted list of the excluded positions: memory grows with ranks x workers x one window,
    not with the epoch.
    """

    _SHIFT = 40  # exclusions are keyed (piece << 40) + position: positions stay below 2^40

    def __init__(self, sequence: Samples, config: PlanConfig, epoch: int, batches: int) -> None:
        self.sequence = sequence
        per_rank = samples_per_rank(sequence.size, config.world_size, config.remainder)
        counts = worker_sample_counts(per_rank, config.num_workers, config.batch_size)
        window = config.shuffle_buffer
        self.streams = [RankStream(sequence, config, epoch, r) for r in range(config.world_size)]
        begins: list[int] = []
        ranks: list[int] = []
        sizes: list[int] = []
        keys: list[np.ndarray] = []
        for rank, stream in enumerate(self.streams):
            pads = stream.pad_positions()
            for worker in range(config.num_readers):
                first, count = sum(counts[:worker]), counts[worker]
                taken = consumed_count(config, per_rank, worker, batches)
                whole = taken // window * window
                begin, end = first + whole, first + count
                excluded = pads[(pads >= begin) & (pads < end)]
                if taken > whole:  # the current window: its first samples in yield order were handed out
                    seed = window_seed(config, epoch, rank, worker, whole // window)
                    positions = np.arange(begin, min(begin + window, end), dtype=np.int64)
                    read = positions[reading_order(*stream.take(positions), config.shuffle)]
                    handed = read[window_permutation(seed, len(read))[: taken - whole]]
                    excluded = np.union1d(excluded, handed)
                piece = len(begins)
                begins.append(begin)
                ranks.append(rank)
                sizes.append(end - begin - len(excluded))
                relative = excluded - begin
                keys.append((piece << self._SHIFT) + relative - np.arange(len(relative)))
        tail = sequence.size - config.world_size * per_rank if config.remainder == "drop" else 0
        begins.append(config.world_size * per_rank)
        ranks.append(-1)  # the dropped tail: sequence positions, no rank stream
        sizes.append(max(tail, 0))
        self.begins = np.asarray(begins, dtype=np.int64)
        self.ranks = np.asarray(ranks, dtype=np.int64)
        self.ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
        self.keys = np.concatenate([np.zeros(0, np.int64), *keys]).astype(np.int64)
        self.sizes = np.diff(self.ends, prepend=0)
        self.size = int(self.ends[-1])

    def take(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        piece = np.searchsorted(self.ends, positions, side="right")
        local = positions - (self.ends[piece] - self.sizes[piece])
        key = (piece << self._SHIFT) + local
        skipped = np.searchsorted(self.keys, key, side="right") - np.searchsorted(
            self.keys, piece << self._SHIFT, side="left"
        )
        stream_position = self.begins[piece] + local + skipped
        where = np.empty(len(positions), dtype=np.int64)
        ranks = self.ranks[piece]
        for rank in np.unique(ranks).tolist():
            mine = ranks == rank
            if rank < 0:
                where[mine] = stream_position[mine]
            else:
                where[mine] = self.streams[rank].sequence_positions(stream_position[mine])
        return self.sequence.take(where)
