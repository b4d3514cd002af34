"""Mixing quality of one output order, computed from what the trainer received: pure NumPy, no I/O.

An order is the sequence of pack positions (0 .. N-1, the sample's place in the packed shards, shard by
shard) in the order the loader yielded them, cut into batches of ``batch_sizes``. Labels and shard numbers
are looked up by pack position. Every metric has a reference a uniform global permutation reaches:

- distinct classes per full batch, against ``C (1 - (1 - 1/C) ** B)`` (B labels drawn uniformly);
- label entropy per full batch in bits, against the same draw's expectation (seeded simulation);
- |Spearman| between output position and pack position: 0 when the order forgets the layout;
- the rate of consecutive samples from the same shard, against ``sum_s (n_s / N) ** 2`` (1/S for equal
  shards): above it, neighbours in the output came from one read;
- the Pearson correlation of a sample's output position in consecutive epochs: 0 when epochs are
  independent, 1 when one order repeats.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

IDEAL_ENTROPY_TRIALS = 4000


def ideal_classes(num_classes: int, batch_size: int) -> float:
    """Expected distinct classes among ``batch_size`` labels drawn uniformly from ``num_classes``."""
    return float(num_classes * (1.0 - (1.0 - 1.0 / num_classes) ** batch_size))


def ideal_entropy(num_classes: int, batch_size: int, *, seed: int = 0) -> float:
    """Expected label entropy (bits) of such a batch, by a seeded simulation (no closed form)."""
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(batch_size, np.full(num_classes, 1.0 / num_classes), size=IDEAL_ENTROPY_TRIALS)
    return float(np.mean(_entropy_rows(counts)))


def full_batches(values: np.ndarray, batch_sizes: Sequence[int], batch_size: int) -> np.ndarray:
    """``values`` cut at ``batch_sizes``, keeping only batches of exactly ``batch_size``: (num_full, B)."""
    if sum(batch_sizes) != len(values):
        raise ValueError(f"batch sizes sum to {sum(batch_sizes)}, but the order holds {len(values)} samples")
    ends = np.cumsum(batch_sizes)
    rows = [
        values[end - size : end] for end, size in zip(ends, batch_sizes, strict=True) if size == batch_size
    ]
    return np.stack(rows) if rows else np.empty((0, batch_size), dtype=values.dtype)


def classes_per_batch(labels: np.ndarray) -> float:
    """Mean distinct labels per row of ``labels`` (num_batches, B)."""
    if len(labels) == 0:
        return float("nan")
    ordered = np.sort(labels, axis=1)
    return float(np.mean(1 + np.count_nonzero(np.diff(ordered, axis=1), axis=1)))


def entropy_per_batch(labels: np.ndarray, num_classes: int) -> float:
    """Mean Shannon entropy (bits) of the label histogram of each row of ``labels`` (num_batches, B)."""
    if len(labels) == 0:
        return float("nan")
    counts = np.zeros((len(labels), num_classes), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(len(labels)), labels.shape[1]), labels.ravel()), 1)
    return float(np.mean(_entropy_rows(counts)))


def _entropy_rows(counts: np.ndarray) -> np.ndarray:
    p = counts / counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log2(p), 0.0)
    return np.asarray(terms.sum(axis=1))


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (ordinal ranks: ties broken by position, fine for near-permutations)."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"need two sequences of equal length >= 2, got {len(x)} and {len(y)}")
    return pearson(_ranks(x), _ranks(y))


def _ranks(values: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[np.argsort(values, kind="stable")] = np.arange(len(values))
    return ranks


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; 0 when either side is constant (no linear relation to speak of)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    dx, dy = x - x.mean(), y - y.mean()
    denominator = float(np.sqrt((dx * dx).sum() * (dy * dy).sum()))
    return float((dx * dy).sum() / denominator) if denominator > 0 else 0.0


def same_shard_rate(shards: np.ndarray) -> float:
    """Fraction of consecutive output pairs read from the same shard."""
    if len(shards) < 2:
        return float("nan")
    return float(np.mean(shards[1:] == shards[:-1]))


def chance_same_shard(shard_sizes: Sequence[int]) -> float:
    """The same rate for a uniform permutation: sum of squared shard shares (1/S for equal shards)."""
    sizes = np.asarray(shard_sizes, dtype=np.float64)
    return float(((sizes / sizes.sum()) ** 2).sum())


def epoch_correlation(order_a: np.ndarray, order_b: np.ndarray, num_samples: int) -> float:
    """Correlation of each sample's output position in two epochs (samples present in both)."""
    where_a = np.full(num_samples, -1, dtype=np.int64)
    where_b = np.full(num_samples, -1, dtype=np.int64)
    where_a[order_a[::-1]] = np.arange(len(order_a))[::-1]  # first occurrence wins (pads repeat samples)
    where_b[order_b[::-1]] = np.arange(len(order_b))[::-1]
    both = (where_a >= 0) & (where_b >= 0)
    return pearson(where_a[both], where_b[both])


def exactly_once(order: np.ndarray, num_samples: int) -> bool:
    """Whether the order holds every pack position exactly once (the epoch contract, checked not assumed)."""
    return len(order) == num_samples and bool(np.all(np.bincount(order, minlength=num_samples) == 1))
