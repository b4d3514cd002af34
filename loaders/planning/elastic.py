"""Resume an interrupted epoch on another world size, worker count or batch size. Pure: no I/O.

A run saved mid-epoch had consumed, on every rank, the same number of batches of one plan: a ``Segment``
(the plan's config and that count). Which samples those were is a function of the segment alone: worker
w of every rank had handed out the first ``consumed_count`` samples of its yield order. The rest of the
epoch is the epoch's sequence minus those samples, in the same order (``remaining_runs``). A resumed run
plans that rest like a fresh sequence with its own config (``loaders.planning.planner``), so every new rank
again runs the same number of steps, and over the epoch each sample is read once, plus the flagged pads (or
minus the drops) of each segment. A run resized twice in one epoch folds its segments in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loaders.planning.planner import (
    PlanConfig,
    Runs,
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


def remaining_of(runs: Runs, shard_sizes: Sequence[int], history: Sequence[Segment], epoch: int) -> Runs:
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
