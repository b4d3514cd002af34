"""Read speed: a loader's batches timed in passes, the sources read alone, and the rotated rounds.

Each loader is read for two passes of the same samples' worth, each clocked on its own. The first starts
its clock when the ``warmup``-th batch has arrived (worker start and the first windows are not a rate) and
is a fresh loader's first epoch, which also fills its shared memory and buffer pools; the second is the
same loader's next epoch, the rate a long training run sees. The sources read alone are one
``ShardedDataset`` each through ``make_loader``, one after another, each pass as many samples as the
mixture's epoch takes of it (epochs cycled, ``set_epoch`` between them), so both sides read the same
samples' worth of each format; their timed samples and seconds add up, pass by pass.
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

PASSES = (("", "first epoch"), ("_next", "next epoch"))
"""The passes each loader is timed for, in order: a key suffix for results (``mixture`` + suffix) and what
the pass is (a fresh loader's first epoch, then its next)."""


@dataclass(frozen=True, slots=True)
class Timing:
    samples: int  # received after the warm-up batches
    seconds: float  # their time
    received: int  # every sample received, the warm-up's included
    sources: list[int] = field(default_factory=list)  # the source index of each sample, when batches carry it

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.samples and self.seconds > 0 else float("nan")


def timed(batches: Iterable[Mapping[str, Any]], warmup: int, passes: Sequence[int]) -> list[Timing]:
    """Iterate ``batches`` for consecutive passes of ``passes[i]`` samples (a pass ends with the batch that
    completes it, or where the batches do), each clocked on its own: the first from the arrival of batch
    ``warmup`` (1-based), each later one from the end of the one before. The first pass keeps the source
    of each sample, where batches carry it."""
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1 batch (the clock starts at one), got {warmup}")
    ends = list(itertools.accumulate(passes))
    clock: tuple[int, float] | None = None  # (samples received, time) when the clock started
    marks: list[tuple[int, float]] = []  # the same at the end of each pass
    received, sources = 0, []
    for index, batch in enumerate(batches, start=1):
        received += len(batch["__key__"])
        if not marks and "__source__" in batch:
            sources += np.asarray(batch["__source__"]).tolist()  # one call: the clock runs here too
        if index == warmup:
            clock = (received, time.perf_counter())
        if received >= ends[len(marks)]:
            marks.append((received, time.perf_counter()))
            if len(marks) == len(ends):
                break
    else:
        if received > (marks[-1][0] if marks else 0):
            marks.append((received, time.perf_counter()))
    found = []
    for k, (count, at) in enumerate(marks):
        before = (0, 0.0) if k == 0 else marks[k - 1]
        since = marks[k - 1] if k else clock
        samples, seconds = (count - since[0], at - since[1]) if since is not None else (0, 0.0)
        found.append(Timing(samples, seconds, count - before[0], sources if k == 0 else []))
    return found


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
    passes: int = len(PASSES),
) -> list[Timing]:
    """Each source read on its own for ``passes`` passes of ``counts[i]`` samples, one source after
    another: per pass, the sum of their timings."""
    parts = []
    for source, count in zip(sources, counts, strict=True):
        dataset = ShardedDataset(source.path, "train", seed=seed, rank=0, world_size=1)
        loader = make_loader(dataset, batch_size, num_workers)
        parts.append(timed(endless(loader, dataset.set_epoch), warmup, [count] * passes))
        del loader, dataset
        gc.collect()  # persistent workers go before the next source's start
    return [
        Timing(sum(p.samples for p in ps), sum(p.seconds for p in ps), sum(p.received for p in ps))
        for ps in zip(*parts, strict=True)
    ]


def rotated_rounds(
    repeats: int, contenders: Mapping[str, Callable[[], list[Timing]]]
) -> dict[str, list[list[Timing]]]:
    """``repeats`` rounds of every contender (each a timing per pass), the first of a round moving down one
    place each round."""
    names = list(contenders)
    found: dict[str, list[list[Timing]]] = {name: [] for name in names}
    for round_index in range(repeats):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            found[name].append(contenders[name]())
            rates = " then ".join(f"{t.samples_per_s:,.0f}" for t in found[name][-1])
            print(f"  round {round_index + 1} {name:14} {rates} samples/s", flush=True)
    return found
