"""What a contender yielded, kept as the benchmark scores it: per epoch, per rank, the batches in the order
the rank received them, each as the source index and the key of every sample (pads dropped).

Every contender's batches carry ``__source__`` (an int64 tensor: each sample's source index) and
``__key__`` (each sample's key); shardpipe's also carry ``__pad__``, a padding duplicate that evaluation
masks, which is no sample of its source and is left out here.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Batch:
    sources: np.ndarray  # (n,) int64: the source index of each sample
    keys: Sequence[Hashable]  # (n,): each sample's identity within its source

    def __post_init__(self) -> None:
        if len(self.sources) != len(self.keys):
            raise ValueError(f"batch of {len(self.sources)} source indices but {len(self.keys)} keys")


@dataclass(frozen=True, slots=True)
class Shape:
    """What every contender's run shares: the simulated world, the loader, the epochs and the seed."""

    world_size: int
    num_workers: int
    batch_size: int
    samples_per_epoch: int  # every contender's epoch: the sum of the sources' sizes, the mixture's default
    epochs: int
    seed: int

    @property
    def processes(self) -> int:
        """Reading processes over the world: a DataLoader worker each (the main process with none)."""
        return self.world_size * max(self.num_workers, 1)


Trace = list[list[list[Batch]]]
"""epoch -> rank -> the rank's batches, in the order it received them."""


def from_loader_batch(batch: Mapping[str, Any]) -> Batch:
    """A collated batch as a :class:`Batch`, padding duplicates dropped."""
    # A copy: a view would keep the batch's shared-memory tensor, and its file descriptor, alive.
    sources = np.asarray(batch["__source__"], dtype=np.int64).copy()
    keys = list(batch["__key__"])
    pads = batch.get("__pad__")
    if pads is None:
        return Batch(sources, keys)
    real = ~np.asarray(pads, dtype=bool)
    return Batch(sources[real], [k for k, keep in zip(keys, real.tolist(), strict=True) if keep])


def collect(
    loader: Iterable[Mapping[str, Any]], set_epoch: Callable[[int], None], epochs: int
) -> list[list[Batch]]:
    """One rank's batches for ``epochs`` whole epochs, ``set_epoch`` called before each."""
    found = []
    for epoch in range(epochs):
        set_epoch(epoch)
        found.append([from_loader_batch(batch) for batch in loader])
    return found


def by_epoch(ranks: Sequence[list[list[Batch]]]) -> Trace:
    """Ranks' runs (rank -> epoch -> batches) turned epoch-major (epoch -> rank -> batches)."""
    if not ranks:
        return []
    return [[rank[epoch] for rank in ranks] for epoch in range(len(ranks[0]))]
