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


def repeats_before_coverage(step_keys: Iterable[Sequence[Hashable]], num_samples: int) -> int:
    """Samples yielded again before every one of the ``num_samples`` samples was yielded once in the
    current pass; a pass ends, and the next begins, the moment the last unseen sample arrives.

    Samples of one step arrive together, so within a step the unseen ones count first: a pass that ends
    inside a step lets the step's other samples begin the next pass instead of counting as repeats.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    seen: set[Hashable] = set()
    repeats = 0
    for keys in step_keys:
        fresh = [k for k in keys if k not in seen]
        for key in fresh + [k for k in keys if k in seen]:
            if key in seen:
                repeats += 1
            else:
                seen.add(key)
                if len(seen) == num_samples:
                    seen.clear()
    return repeats


def repeats(trace: Trace, sizes: Sequence[int]) -> list[int]:
    """:func:`repeats_before_coverage` of every source (``sizes``: samples per source) over ``trace``."""
    return [repeats_before_coverage(steps(trace, i), size) for i, size in enumerate(sizes)]


def excess_at_epoch_ends(epoch_keys: Iterable[Sequence[Hashable]], num_samples: int) -> int:
    """The most yields, at any epoch's end, beyond what walking whole passes allows: a source read pass by
    pass has every sample yielded k or k+1 times so far, so each yield past the least count plus one is a
    repeat before coverage. Counted over whole epochs, it needs no order within an epoch (however ranks,
    workers and windows cut it), and an in-epoch repeat that the epoch made up for goes uncounted."""
    counts: Counter[Hashable] = Counter()
    worst = 0
    for keys in epoch_keys:
        counts.update(keys)
        if len(counts) > num_samples:
            raise ValueError(f"{len(counts)} distinct samples of a source of {num_samples}")
        least = min(counts.values()) if len(counts) == num_samples else 0
        worst = max(worst, sum(max(0, c - least - 1) for c in counts.values()))
    return worst


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
    """:func:`excess_at_epoch_ends` of every source over ``trace``."""
    return [excess_at_epoch_ends(epoch_keys(trace, i), size) for i, size in enumerate(sizes)]


def largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """``total`` split by ``weights``: each floor(weight x total), the leftover one by one to the largest
    fractional parts (ties to the earlier source); the counts sum to ``total``."""
    shares = np.asarray(weights, dtype=np.float64) / float(np.sum(weights)) * total
    counts = np.floor(shares).astype(np.int64)
    order = np.argsort(-(shares - counts), kind="stable")
    counts[order[: total - int(counts.sum())]] += 1
    return [int(c) for c in counts]
