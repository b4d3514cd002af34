"""Read speed: a loader's batches timed after a warm-up, the sources read alone, and the rotated rounds.

A timing starts its clock when the ``warmup``-th batch has arrived (worker start and the first windows are
not the steady rate) and counts the samples after it. The sources read alone are one ``ShardedDataset``
each through ``make_loader``, one after another, each for as many samples as the mixture's epoch takes of
it (epochs cycled, ``set_epoch`` between them), so both sides read the same samples' worth of each format;
their timed samples and seconds add up.
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.mix.data import Source
from loaders import ShardedDataset, make_loader


@dataclass(frozen=True, slots=True)
class Timing:
    samples: int  # received after the warm-up batches
    seconds: float  # their time
    received: int  # every sample received, the warm-up's included
    sources: list[int] = field(default_factory=list)  # the source index of each sample, when batches carry it

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.samples and self.seconds > 0 else float("nan")


def timed(batches: Iterable[Mapping[str, Any]], warmup: int, stop_after: int | None = None) -> Timing:
    """Iterate ``batches`` (up to the batch that brings ``stop_after`` samples, if given), clocked from the
    arrival of batch ``warmup`` (1-based)."""
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1 batch (the clock starts at one), got {warmup}")
    received, started, at_start, sources = 0, 0.0, 0, []
    for index, batch in enumerate(batches, start=1):
        received += len(batch["__key__"])
        if "__source__" in batch:
            sources += np.asarray(batch["__source__"]).tolist()  # one call: the clock runs here too
        if index == warmup:
            started, at_start = time.perf_counter(), received
        if stop_after is not None and received >= stop_after:
            break
    seconds = time.perf_counter() - started if started else 0.0
    return Timing(received - at_start, seconds, received, sources)


def endless(
    loader: Iterable[Mapping[str, Any]], set_epoch: Callable[[int], None]
) -> Iterator[Mapping[str, Any]]:
    """The loader's epochs one after another, ``set_epoch`` before each."""
    for epoch in itertools.count():
        set_epoch(epoch)
        yield from loader


def sources_alone(
    sources: Sequence[Source],
    counts: Sequence[int],
    *,
    batch_size: int,
    num_workers: int,
    warmup: int,
    seed: int,
) -> Timing:
    """Each source read on its own for ``counts[i]`` samples, one after another: the sum of their timings."""
    parts = []
    for source, count in zip(sources, counts, strict=True):
        dataset = ShardedDataset(source.path, "train", seed=seed, rank=0, world_size=1)
        loader = make_loader(dataset, batch_size, num_workers)
        parts.append(timed(endless(loader, dataset.set_epoch), warmup, stop_after=count))
        del loader, dataset
        gc.collect()  # persistent workers go before the next source's start
    return Timing(
        sum(p.samples for p in parts), sum(p.seconds for p in parts), sum(p.received for p in parts)
    )


def rotated_rounds(repeats: int, contenders: Mapping[str, Callable[[], Timing]]) -> dict[str, list[Timing]]:
    """``repeats`` rounds of every contender, the first of a round moving down one place each round."""
    names = list(contenders)
    found: dict[str, list[Timing]] = {name: [] for name in names}
    for round_index in range(repeats):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            found[name].append(contenders[name]())
            print(
                f"  round {round_index + 1} {name:14} {found[name][-1].samples_per_s:11,.0f} samples/s",
                flush=True,
            )
    return found
