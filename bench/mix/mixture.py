"""shardpipe's ``Mixture`` as a contender: its trace at a simulated world size, and its timed epoch.

Every rank is planned in turn: its sources are ``ShardedDataset(rank=, world_size=)`` and ``RANK`` /
``WORLD_SIZE`` are set while its loader is built and read, so the mixture takes that place in the world
however it learns it. The mixture's source indices (``batch["__source__"]``, in ``mix.names`` order) are
mapped to the benchmark's source order.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from bench.mix.data import Source
from bench.mix.peers import simulated_rank
from bench.mix.speed import PASSES, Timing, endless, timed
from bench.mix.trace import Shape, Trace, by_epoch, collect
from loaders import Mixture, ShardedDataset, make_loader


def build(sources: Sequence[Source], *, rank: int, world_size: int, seed: int, per_batch: bool) -> Mixture:
    """The mixture of ``sources`` at their weights, one epoch the sum of their sizes (the default)."""
    datasets = {
        s.spec.name: ShardedDataset(s.path, "train", seed=seed, rank=rank, world_size=world_size)
        for s in sources
    }
    weights = {s.spec.name: s.spec.weight for s in sources}
    return Mixture(datasets, weights=weights, samples_per_epoch=None, per_batch=per_batch, seed=seed)


class _Reindexed:
    """A loader's batches with ``__source__`` in the benchmark's source order instead of ``mix.names``'."""

    def __init__(self, loader: Any, names: Sequence[str], order: Sequence[str]) -> None:
        unknown = sorted(set(names) ^ set(order))
        if unknown:
            raise ValueError(
                f"the mixture names {list(names)}, the benchmark {list(order)}: {unknown} differ"
            )
        self.loader = loader
        self.remap = np.asarray([list(order).index(name) for name in names], dtype=np.int64)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.loader:
            yield {**batch, "__source__": self.remap[np.asarray(batch["__source__"], dtype=np.int64)]}


def trace(sources: Sequence[Source], shape: Shape, *, per_batch: bool) -> Trace:
    """``shape.epochs`` epochs of the mixture on every rank of the world, ranks in turn (the mixture's
    epoch is its default, the sum of the sources' sizes, which ``shape.samples_per_epoch`` must be)."""
    if shape.samples_per_epoch != sum(s.spec.num_samples for s in sources):
        raise ValueError(
            f"the mixture's epoch is the sum of its sources' sizes, not {shape.samples_per_epoch}"
        )
    order = [s.spec.name for s in sources]
    ranks = []
    for rank in range(shape.world_size):
        with simulated_rank(rank, shape.world_size):
            mix = build(sources, rank=rank, world_size=shape.world_size, seed=shape.seed, per_batch=per_batch)
            loader = make_loader(mix, batch_size=shape.batch_size, num_workers=shape.num_workers)
            ranks.append(collect(_Reindexed(loader, mix.names, order), mix.set_epoch, shape.epochs))
            del loader, mix
            gc.collect()  # persistent workers go before the next rank's start
    return by_epoch(ranks)


def timed_epochs(
    sources: Sequence[Source],
    *,
    batch_size: int,
    num_workers: int,
    warmup: int,
    seed: int,
    epochs: int = len(PASSES),
) -> list[Timing]:
    """The mixture's first ``epochs`` epochs on one rank, each timed on its own (the first after ``warmup``
    batches); the first epoch's source sequence kept."""
    mix = build(sources, rank=0, world_size=1, seed=seed, per_batch=False)
    loader = make_loader(mix, batch_size=batch_size, num_workers=num_workers)
    reindexed = _Reindexed(loader, mix.names, [s.spec.name for s in sources])
    found = timed(endless(reindexed, mix.set_epoch), warmup, [mix.epoch_size(e) for e in range(epochs)])
    del loader, mix
    gc.collect()
    return found
