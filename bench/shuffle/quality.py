"""One configuration's epochs turned into the metrics of ``bench.shuffle.metrics``, for one pack.

Per-epoch metrics (classes, entropy, |Spearman|, same-shard rate) are averaged over the epochs; the epoch
correlation is averaged over consecutive pairs. Each epoch is also checked to hold every sample exactly
once, so a metric is never computed on a broken order.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass

import numpy as np

from bench.shuffle import metrics
from bench.shuffle.contenders import EpochRun
from bench.shuffle.data import Pack


@dataclass(frozen=True, slots=True)
class Quality:
    classes_per_batch: float
    ideal_classes: float
    classes_ratio: float  # classes_per_batch / ideal_classes
    entropy_bits: float
    ideal_entropy_bits: float
    spearman_abs: float
    same_shard_rate: float
    chance_same_shard: float  # ~1/S
    same_shard_ratio: float  # same_shard_rate / chance_same_shard: 1 = as random
    epoch_correlation: float | None  # None with one epoch
    exactly_once: bool
    full_batches: int


def evaluate(pack: Pack, runs: list[EpochRun], batch_size: int, num_classes: int) -> Quality:
    position = pack.position_of()
    orders = [
        np.fromiter((position[k] for k in run.keys), dtype=np.int64, count=len(run.keys)) for run in runs
    ]
    classes, entropy, rho, same, full = [], [], [], [], 0
    for run, order in zip(runs, orders, strict=True):
        labels = metrics.full_batches(pack.labels[order], run.batch_sizes, batch_size)
        full += len(labels)
        classes.append(metrics.classes_per_batch(labels))
        entropy.append(metrics.entropy_per_batch(labels, num_classes))
        rho.append(abs(metrics.spearman(np.arange(len(order)), order)))
        same.append(metrics.same_shard_rate(pack.shards[order]))
    pairs = [metrics.epoch_correlation(a, b, len(pack.keys)) for a, b in itertools.pairwise(orders)]
    ideal = metrics.ideal_classes(num_classes, batch_size)
    chance = metrics.chance_same_shard(pack.shard_sizes)
    return Quality(
        classes_per_batch=statistics.mean(classes),
        ideal_classes=ideal,
        classes_ratio=statistics.mean(classes) / ideal,
        entropy_bits=statistics.mean(entropy),
        ideal_entropy_bits=metrics.ideal_entropy(num_classes, batch_size),
        spearman_abs=statistics.mean(rho),
        same_shard_rate=statistics.mean(same),
        chance_same_shard=chance,
        same_shard_ratio=statistics.mean(same) / chance,
        epoch_correlation=statistics.mean(pairs) if pairs else None,
        exactly_once=all(metrics.exactly_once(o, len(pack.keys)) for o in orders),
        full_batches=full,
    )
