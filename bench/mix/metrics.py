"""How far a mixture's output is from its weights, and whether a source repeats before it is covered.

Pure functions of the sources and keys a contender yielded (``bench.mix.trace``). A run of ``n`` samples
should hold ``weight x n`` of each source; its error is the largest miss over the sources, in samples. The
runs scored are the cuts a trainer sees: each batch, each rank's share of an epoch, each worker's part of
it, each shuffle window of a worker part, and each whole epoch.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Sequence

import numpy as np

from bench.mix.trace import Batch, Trace

KINDS = ("batch", "rank share", "worker part", "shuffle window", "epoch")


def deviation(sources: np.ndarray, weights: Sequence[float]) -> float:
    """max over sources of |count - weight x n| for the run ``sources`` (source index per sample)."""
    target = np.asarray(weights, dtype=np.float64)
    if np.any(sources < 0) or np.any(sources >= len(target)):
        raise ValueError(f"source indices must be in [0, {len(target)}), got {np.unique(sources).tolist()}")
    counts = np.bincount(sources, minlength=len(target))
    return float(np.max(np.abs(counts - target * len(sources))))


def worst(runs: Iterable[np.ndarray], weights: Sequence[float]) -> float:
    """The largest :func:`deviation` over ``runs``; 0 when there is none."""
    return max((deviation(run, weights) for run in runs), default=0.0)


def concat(batches: Sequence[Batch]) -> np.ndarray:
    return np.concatenate([b.sources for b in batches]) if batches else np.empty(0, dtype=np.int64)


def worker_parts(batches: Sequence[Batch], num_workers: int) -> list[np.ndarray]:
    """A rank's batches split by the worker that made them: batch j comes from worker j mod workers, as
    the planner's whole-batch split of a rank's share over workers makes the DataLoader deliver them."""
    workers = max(num_workers, 1)
    return [concat(batches[k::workers]) for k in range(workers)]


def windows(part: np.ndarray, size: int) -> list[np.ndarray]:
    """``part`` cut into consecutive runs of ``size`` samples from its start (the last may be shorter)."""
    if size < 1:
        raise ValueError(f"window size must be >= 1, got {size}")
    return [part[start : start + size] for start in range(0, len(part), size)]


def composition(trace: Trace, weights: Sequence[float], num_workers: int, window: int) -> dict[str, float]:
    """The largest error of each kind of run (:data:`KINDS`) over every epoch and rank of ``trace``."""
    runs: dict[str, list[np.ndarray]] = {kind: [] for kind in KINDS}
    for ranks in trace:
        for batches in ranks:
            runs["batch"] += [b.sources for b in batches]
            runs["rank share"].append(concat(batches))
            parts = worker_parts(batches, num_workers)
            runs["worker part"] += parts
            runs["shuffle window"] += [w for part in parts for w in windows(part, window)]
        runs["epoch"].append(np.concatenate([concat(batches) for batches in ranks]))
    return {kind: worst(found, weights) for kind, found in runs.items()}


def steps(trace: Trace, source: int) -> Iterator[list[Hashable]]:
    """The keys of ``source`` in training order: per epoch, per step, every rank's batch of that step
    together (ranks step in lockstep; a rank with fewer batches contributes nothing to the later steps)."""
    for ranks in trace:
        for step in itertools.zip_longest(*ranks):
            keys: list[Hashable] = []
            for batch in step:
                if batch is not None:
                    keys += [
                        k for k, s in zip(batch.keys, batch.sources.tolist(), strict=True) if s == source
                    ]
            yield keys


def excess_over_passes(groups: Iterable[Sequence[Hashable]], num_samples: int) -> int:
    """The most yields, after any group (an epoch, or a step), beyond what walking whole passes allows: a
    source read pass by pass has every sample yielded k or k+1 times so far, so each yield past the least
    count plus one is a repeat before coverage. It needs no order within a group, and an early yield that
    the group made up for goes uncounted; it is a count at one moment, so a pass that ran ahead once does not
    count again in every pass after it."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    counts: Counter[Hashable] = Counter()
    held = Counter({0: num_samples})  # how many samples have each count (the unseen ones count 0)
    worst = 0
    for keys in groups:
        for key in keys:
            count = counts[key]
            held[count] -= 1
            held[count + 1] += 1
            counts[key] = count + 1
        if len(counts) > num_samples:
            raise ValueError(f"{len(counts)} distinct samples of a source of {num_samples}")
        least = min(c for c, n in held.items() if n > 0)
        worst = max(worst, sum(n * (c - least - 1) for c, n in held.items() if c > least + 1))
    return worst


def repeats(trace: Trace, sizes: Sequence[int]) -> list[int]:
    """:func:`excess_over_passes` of every source (``sizes``: samples per source) over ``trace``'s
    training order, step by step."""
    return [excess_over_passes(steps(trace, i), size) for i, size in enumerate(sizes)]


def epoch_keys(trace: Trace, source: int) -> Iterator[list[Hashable]]:
    """The keys of ``source`` each epoch yielded, every rank's together."""
    for ranks in trace:
        yield [
            k
            for batches in ranks
            for b in batches
            for k, s in zip(b.keys, b.sources.tolist(), strict=True)
            if s == source
        ]


def excess(trace: Trace, sizes: Sequence[int]) -> list[int]:
    """:func:`excess_over_passes` of every source over ``trace``, epoch by epoch."""
    return [excess_over_passes(epoch_keys(trace, i), size) for i, size in enumerate(sizes)]


def largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """``total`` split by ``weights``: each floor(weight x total), the leftover one by one to the largest
    fractional parts (ties to the earlier source); the counts sum to ``total``."""
    shares = np.asarray(weights, dtype=np.float64) / float(np.sum(weights)) * total
    counts = np.floor(shares).astype(np.int64)
    order = np.argsort(-(shares - counts), kind="stable")
    counts[order[: total - int(counts.sum())]] += 1
    return [int(c) for c in counts]
