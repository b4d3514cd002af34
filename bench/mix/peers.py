"""The peers' ways of mixing, each run the way its users run it, as :data:`bench.mix.trace.Trace`.

``random-mix``: webdataset's ``RandomMix`` over the tar copies of the sources, read through a real
DataLoader per simulated rank (``RANK``/``WORLD_SIZE`` set: webdataset's ``split_by_node`` reads them).
Each source is ``WebDataset(shards, detshuffle=True, seed=...)`` (a new shard order each pass), a seeded
sample buffer, and ``.repeat()``, so no source runs dry; an epoch is ``with_epoch`` whole batches per
worker, as many in all as the mixture's epoch holds. ``RandomMix`` picks each sample's source with Python's
global ``random``: it takes no seed, but torch seeds ``random`` in each DataLoader worker from the loader's
``generator``, so it is seeded that way, one seed per rank (an unseeded run also differs per process).

``weighted-draw``: a seeded per-sample weighted draw of the source (numpy), simulated without I/O: every
(epoch, rank, worker) process draws each of its samples' source independently with the weights, as HF
``interleave_datasets(probabilities=...)``, LitData ``CombinedStreamingDataset(weights=...)`` and
torchdata's ``MultiNodeWeightedSampler`` do. Each process reads its own slice of each source in a
permutation drawn per epoch, reshuffled when the slice runs out, and every epoch starts each source over,
as a fresh iterator does. The streams are independent per process: the best case of random draws (LitData
and HF replay one stream in every worker, which only adds to the deviations).
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from bench.mix.trace import Batch, Shape, Trace, by_epoch, collect
from loaders.planning.planner import worker_sample_counts

SHUFFLE_BUFFER = 1024  # webdataset's sample buffer per source, shardpipe's default window


@contextlib.contextmanager
def simulated_rank(rank: int, world_size: int) -> Iterator[None]:
    """``RANK`` and ``WORLD_SIZE`` set as torchrun sets them, restored afterwards: what a loader built and
    iterated inside (its workers forked inside) takes for its place in the world."""
    saved = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE")}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _Tag:
    """Keep a webdataset sample's key and mark its source (the payload was read, and is not needed)."""

    def __init__(self, source: int) -> None:
        self.source = source

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return {"__key__": sample["__key__"], "__source__": self.source}


def _collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [s["__key__"] for s in samples]
    return {
        "__key__": keys,
        "__source__": torch.tensor([s["__source__"] for s in samples], dtype=torch.int64),
    }


def random_mix_loader(
    tars: Sequence[Sequence[str]],
    weights: Sequence[float],
    *,
    batch_size: int,
    num_workers: int,
    batches_per_worker: int,
    seed: int,
    rank: int,
) -> DataLoader[Any]:
    """webdataset's ``RandomMix`` of the sources (``tars``: each source's shard paths), one rank's loader."""
    import webdataset as wds

    sources = [
        wds.WebDataset(
            list(urls),
            shardshuffle=len(urls),
            detshuffle=True,
            seed=seed + index,
            nodesplitter=wds.split_by_node,
            empty_check=False,
        )
        .shuffle(SHUFFLE_BUFFER, seed=seed + index)
        .map(_Tag(index))
        .repeat()
        for index, urls in enumerate(tars)
    ]
    mix = wds.RandomMix(sources, list(weights))
    batched = wds.DataPipeline(mix, wds.batched(batch_size, collation_fn=_collate, partial=True))
    pipeline = batched.with_epoch(nbatches=batches_per_worker)
    return DataLoader(
        pipeline,
        batch_size=None,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        prefetch_factor=4 if num_workers > 0 else None,
        generator=torch.Generator().manual_seed(seed * 1_000_003 + rank),
    )


def random_mix(tars: Sequence[Sequence[str]], weights: Sequence[float], shape: Shape) -> Trace:
    """``shape.epochs`` epochs of :func:`random_mix_loader` on every rank of the world, ranks in turn."""
    batches_per_worker = max(shape.samples_per_epoch // (shape.processes * shape.batch_size), 1)
    ranks = []
    for rank in range(shape.world_size):
        if shape.num_workers == 0:  # no worker for torch to seed: RandomMix draws in this process
            random.seed(shape.seed * 1_000_003 + rank)
        with simulated_rank(rank, shape.world_size):
            loader = random_mix_loader(
                tars,
                weights,
                batch_size=shape.batch_size,
                num_workers=shape.num_workers,
                batches_per_worker=batches_per_worker,
                seed=shape.seed,
                rank=rank,
            )
            ranks.append(collect(loader, _no_epoch, shape.epochs))
            del loader  # its persistent workers end before the next rank's start
    return by_epoch(ranks)


def _no_epoch(epoch: int) -> None:
    """webdataset has no epoch hook: its stages advance on each pass themselves."""


def weighted_draw(sizes: Sequence[int], weights: Sequence[float], shape: Shape) -> Trace:
    """The seeded per-sample weighted draw, simulated for every rank and worker (see the module)."""
    workers, processes, seed = max(shape.num_workers, 1), shape.processes, shape.seed
    if min(sizes) < processes:
        raise ValueError(
            f"every source needs >= {processes} samples (one per process), got sizes {list(sizes)}"
        )
    probabilities = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
    batch_size = shape.batch_size
    counts = worker_sample_counts(shape.samples_per_epoch // shape.world_size, shape.num_workers, batch_size)
    trace: Trace = []
    for epoch in range(shape.epochs):
        slices = [
            np.random.default_rng([seed, epoch, i]).permutation(size)[p::processes]
            for i, size in enumerate(sizes)
            for p in range(processes)
        ]  # slices[i * processes + p]: process p's slice of source i this epoch
        ranks = []
        for rank in range(shape.world_size):
            parts = []
            for worker, count in enumerate(counts):
                process = rank * workers + worker
                rng = np.random.default_rng([seed, epoch, rank, worker])
                drawn = rng.choice(len(sizes), size=count, p=probabilities)
                keys = _keys(drawn, [slices[i * processes + process] for i in range(len(sizes))], rng)
                cuts = range(0, count, batch_size)
                parts.append([Batch(drawn[j : j + batch_size], keys[j : j + batch_size]) for j in cuts])
            ranks.append(_round_robin(parts))
        trace.append(ranks)
    return trace


def _keys(drawn: np.ndarray, slices: list[np.ndarray], rng: np.random.Generator) -> list[int]:
    """The sample each draw reads: the next of its source's slice, the slice reshuffled when it runs out."""
    streams: list[Iterator[int]] = [_cycle(s, rng) for s in slices]
    return [next(streams[i]) for i in drawn.tolist()]


def _cycle(items: np.ndarray, rng: np.random.Generator) -> Iterator[int]:
    order = items
    while len(order):
        yield from order.tolist()
        order = rng.permutation(items)


def _round_robin(parts: list[list[Batch]]) -> list[Batch]:
    """Workers' batches in the order a DataLoader delivers them: one from each in turn, skipping the done."""
    out: list[Batch] = []
    for j in range(max((len(p) for p in parts), default=0)):
        out += [part[j] for part in parts if j < len(part)]
    return out
