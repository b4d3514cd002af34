"""A mixture's weights, checked, and the exact per-source counts of one epoch. Pure: no I/O.

Weights come as a mapping of source name to a fraction (normalised) or to an int (an absolute count per
epoch); as a list of those (epoch e uses item ``min(e, len - 1)``), or a function of the epoch; and any
epoch's value may be :class:`Stages`, weights that change at given global sample indices of the epoch.
Counts are the largest-remainder rounding of weight x samples (ties to the earlier source), so every
epoch (and every stage) holds exactly its total.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TypeAlias

Weights = Mapping[str, float]
EpochWeights: TypeAlias = "Weights | Stages"
WeightSchedule: TypeAlias = "EpochWeights | Sequence[EpochWeights] | Callable[[int], EpochWeights]"


@dataclass(frozen=True, slots=True)
class Stages:
    """Weights that change within an epoch: ``((0, w0), (start1, w1), ...)``, stage i covering global
    sample indices [start_i, start_{i+1}) of the epoch. Stage weights are fractions (normalised)."""

    stages: tuple[tuple[int, Weights], ...]

    def __post_init__(self) -> None:
        starts = [start for start, _ in self.stages]
        if not starts or starts[0] != 0:
            raise ValueError(f"Stages must start at index 0, got starts {starts}")
        for start in starts:
            if isinstance(start, bool) or not isinstance(start, int):
                raise TypeError(f"a stage start must be an int, got {start!r}")
        if any(b <= a for a, b in pairwise(starts)):
            raise ValueError(f"stage starts must increase, got {starts}")


@dataclass(frozen=True, slots=True)
class Stage:
    """One stretch of an epoch's sequence: ``counts[s]`` samples of source s from global index ``start``."""

    start: int
    counts: tuple[int, ...]

    @property
    def num_samples(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True, slots=True)
class EpochMix:
    """One epoch's composition: its stages in order; ``counts`` sums them per source."""

    stages: tuple[Stage, ...]

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(sum(column) for column in zip(*(stage.counts for stage in self.stages), strict=True))

    @property
    def num_samples(self) -> int:
        return sum(stage.num_samples for stage in self.stages)

    def to_json(self) -> list[list[int]]:
        return [[stage.start, *stage.counts] for stage in self.stages]


def largest_remainder(weights: Sequence[float], total: int) -> tuple[int, ...]:
    """Integer counts summing to ``total``, each within one of weight x total (weights sum to 1)."""
    exact = [w * total for w in weights]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return tuple(counts)


def epoch_weights(schedule: WeightSchedule, epoch: int) -> EpochWeights:
    """The weights of ``epoch`` under a schedule (a value, a list, or a function of the epoch)."""
    if isinstance(schedule, (Mapping, Stages)):
        return schedule
    if callable(schedule):
        return schedule(epoch)
    items = list(schedule)
    if not items:
        raise ValueError("a weights list must hold at least one epoch's weights")
    return items[min(epoch, len(items) - 1)]


def epoch_mix(
    weights: EpochWeights, names: Sequence[str], sizes: Sequence[int], samples_per_epoch: int | None
) -> EpochMix:
    """The exact composition of one epoch; ``samples_per_epoch=None`` means the sum of ``sizes``, or the
    sum of the counts when the weights are counts."""
    if isinstance(weights, Stages):
        total = sum(sizes) if samples_per_epoch is None else samples_per_epoch
        bounds = [start for start, _ in weights.stages[1:]]
        if bounds and bounds[-1] >= total:
            raise ValueError(f"stage start {bounds[-1]} is not inside the epoch of {total} samples")
        starts = [0, *bounds]
        lengths = [b - a for a, b in zip(starts, [*bounds, total], strict=True)]
        stages = []
        for (start, value), length in zip(weights.stages, lengths, strict=True):
            fractions = _fractions(value, names)
            stages.append(Stage(start, largest_remainder(fractions, length)))
        return EpochMix(tuple(stages))
    values = _values(weights, names)
    if all(isinstance(v, int) for v in values):
        counts = tuple(int(v) for v in values)
        if samples_per_epoch is not None and samples_per_epoch != sum(counts):
            raise ValueError(
                f"the weights are counts summing to {sum(counts)}, but samples_per_epoch="
                f"{samples_per_epoch}; give fractions, or leave samples_per_epoch out"
            )
        return EpochMix((Stage(0, counts),))
    total = sum(sizes) if samples_per_epoch is None else samples_per_epoch
    return EpochMix((Stage(0, largest_remainder(_fractions(weights, names), total)),))


def _values(weights: Weights, names: Sequence[str]) -> list[float]:
    if not isinstance(weights, Mapping):
        raise TypeError(f"weights must map source names to numbers, got {type(weights).__name__}")
    unknown = sorted(set(weights) - set(names))
    missing = [name for name in names if name not in weights]
    if unknown or missing:
        raise ValueError(
            f"weights name unknown source(s) {unknown} and miss source(s) {missing}; "
            f"the sources are {list(names)}"
        )
    values = []
    for name in names:
        value = weights[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"weight of {name!r} must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"weight of {name!r} must be finite and >= 0, got {value!r}")
        values.append(value)
    if sum(values) <= 0:
        raise ValueError(f"the weights sum to {sum(values)}; at least one source needs a positive weight")
    return values


def _fractions(weights: Weights, names: Sequence[str]) -> list[float]:
    values = _values(weights, names)
    total = math.fsum(values)
    return [v / total for v in values]
