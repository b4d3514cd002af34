"""The orders under test, each read through a real DataLoader, and the runner that records them.

Families: ``shardpipe`` (its defaults, the reference contiguous-window setting, and a grid of
``shuffle_buffer`` x ``block_size``, all through the public ``ShardedDataset`` + ``make_loader``),
``webdataset`` (``.shuffle(n)`` on the same tar shards, set up as in ``bench.io.contenders``), and
``global-permutation`` (``DistributedSampler(shuffle=True)`` over the pack's ``lmdb-loop`` copy: the ideal).
Memory is the samples the shuffle holds per worker: the window (``shuffle_buffer``), webdataset's buffer
(``n``), none for random access.

A run iterates whole epochs with persistent workers, calling each loader's own epoch hook between them, and
keeps the key of every sample in the order the trainer received it; read speed is the samples after the
first ``warmup`` batches of an epoch over the time they took (the main process only collects keys).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler

from bench.io.contenders import SEED, LoaderSettings, webdataset_loader
from bench.io.lmdb_loop import LmdbLoopDataset
from bench.shuffle.data import Pack
from loaders import ShardedDataset, make_loader

REFERENCE = (1024, 256)  # (shuffle_buffer, block_size): the old contiguous-window default


@dataclass(frozen=True, slots=True)
class Config:
    family: str  # "shardpipe", "webdataset" or "global-permutation"
    label: str
    shuffle_buffer: int | None = None  # None: the library's default (shardpipe) or no buffer
    block_size: int | None = None

    @property
    def is_default(self) -> bool:
        return self.family == "shardpipe" and self.shuffle_buffer is None and self.block_size is None


@dataclass(frozen=True, slots=True)
class EpochRun:
    keys: list[str]
    batch_sizes: list[int]
    timed_samples: int  # received after the warm-up batches
    seconds: float  # their time

    @property
    def samples_per_s(self) -> float:
        return self.timed_samples / self.seconds if self.timed_samples and self.seconds > 0 else float("nan")


@dataclass(frozen=True, slots=True)
class Built:
    loader: Iterable[Any]
    set_epoch: Callable[[int], None]
    memory_samples: int  # samples the shuffle holds per worker
    shuffle_buffer: int | None
    block_size: int | None


DEFAULT = Config("shardpipe", "shardpipe defaults")
REFERENCE_CONFIG = Config("shardpipe", "shardpipe reference", *REFERENCE)


def grid(buffers: list[int], blocks: list[int]) -> list[Config]:
    """Defaults, the reference, then every (buffer, block) pair, then webdataset and the ideal."""
    configs = [DEFAULT, REFERENCE_CONFIG]
    configs += [Config("shardpipe", f"shardpipe b={b} w={n}", n, b) for n in buffers for b in blocks]
    configs += [Config("webdataset", f"webdataset shuffle({n})", n) for n in buffers]
    return [*configs, Config("global-permutation", "global permutation")]


def build(config: Config, pack: Pack, settings: LoaderSettings) -> Built:
    if config.family == "shardpipe":
        options: dict[str, Any] = {"shuffle_buffer": config.shuffle_buffer, "block_size": config.block_size}
        chosen = {name: value for name, value in options.items() if value is not None}  # else the default
        dataset = ShardedDataset(pack.path, seed=SEED, **chosen)
        loader = make_loader(dataset, settings.batch_size, settings.num_workers)
        buffer, block = dataset.options.shuffle_buffer, dataset.options.block_size  # the defaults, read back
        return Built(loader, loader.set_epoch, buffer, buffer, block)
    if config.family == "webdataset":
        if config.shuffle_buffer is None:
            raise ValueError(f"{config.label}: webdataset needs a buffer size")
        return Built(
            _webdataset(pack, settings, config.shuffle_buffer),
            _no_epoch,
            config.shuffle_buffer,
            config.shuffle_buffer,
            None,
        )
    if config.family == "global-permutation":
        dataset_map = LmdbLoopDataset(pack.lmdb)
        sampler: DistributedSampler[Any] = DistributedSampler(
            dataset_map, num_replicas=1, rank=0, shuffle=True, seed=SEED
        )
        loader_map = DataLoader(
            dataset_map, batch_size=settings.batch_size, sampler=sampler, **settings.dataloader_kwargs()
        )
        return Built(loader_map, sampler.set_epoch, 0, None, None)
    raise ValueError(f"unknown family {config.family!r}; choose shardpipe, webdataset or global-permutation")


def _no_epoch(epoch: int) -> None:
    """webdataset has no epoch hook: a user relies on its own reseeding at each pass."""


def _webdataset(pack: Pack, s: LoaderSettings, buffer: int) -> Iterable[Any]:
    return webdataset_loader([str(p) for p in pack.shard_files], s, buffer)


def run_epochs(built: Built, epochs: int, warmup: int) -> list[EpochRun]:
    """Iterate ``epochs`` whole epochs; the keys in the order received and the read speed of each.

    The clock starts when batch ``warmup`` (1-based) has arrived; the samples after it count.
    """
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1 batch (the clock starts at one), got {warmup}")
    runs = []
    for epoch in range(epochs):
        built.set_epoch(epoch)
        keys: list[str] = []
        sizes: list[int] = []
        started, counted = 0.0, 0
        for batch in built.loader:
            keys.extend(batch["__key__"])
            sizes.append(len(batch["__key__"]))
            if len(sizes) == warmup:
                started, counted = time.perf_counter(), len(keys)
        elapsed = time.perf_counter() - started if started else 0.0
        runs.append(EpochRun(keys, sizes, len(keys) - counted, elapsed))
    return runs
