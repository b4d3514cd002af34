"""The loaders under test, each built fresh per run with the same DataLoader settings.

Every contender yields the same batch shape: a dict with ``__key__`` (list), ``bin`` and ``cls`` as
:class:`loaders.batches.RaggedBytes` (collated by ``loaders.batches.collate_samples``), so the consumer
and the worker-to-main transfer cost the same for all, and the difference is how samples are found and read.
Two kinds of rows are the exception, on purpose, because they read as users do: the ``shardpipe-*-cls``
rows decode ``cls`` to integers (``decode={"cls": "cls"}``, one int64 tensor per batch, still on
``make_loader``'s batch path), beside the raw row of the same format (:data:`CLS_RAW` pairs them for the
targets); ``lmdb-loop`` is the loop a user writes by hand (labels parsed per sample, ``bin`` a list of
``bytes``, its own collate, no shardpipe code), the baseline of the read-path targets.
All shuffle: DistributedSampler for map-style (raw files, ``lmdb-loop``), shard + buffer shuffle for the
streaming ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, get_worker_info

from bench.io import lmdb_loop
from bench.io.data import Dataset as BenchData
from bench.io.data import label_of
from loaders import ShardedDataset, make_loader
from loaders.batches import collate_samples
from loaders.transfer.transport import Transport

NAMES = (
    "raw-files",
    "webdataset",
    "lmdb-loop",
    "shardpipe-tar",
    "shardpipe-tar-cls",
    "shardpipe-lmdb",
    "shardpipe-lmdb-cls",
    "shardpipe-tfrecord",
    "shardpipe-tfrecord-cls",
    "in-memory",
)
CLS_RAW = {f"shardpipe-{f}-cls": f"shardpipe-{f}" for f in ("tar", "lmdb", "tfrecord")}
"""Each decoding row and the raw-bytes row of the same format it is judged against."""
CLS_DECODE = {"cls": "cls"}
CHECK_OFF = ("shardpipe-tar-nocheck", "shardpipe-lmdb-nocheck", "shardpipe-tfrecord-nocheck")
"""Opt-in contenders (``--checks``): the same readers with per-sample checks off, to price the checks."""
VARIANTS = ("shardpipe-tar-pipe", "shardpipe-tar-ring")
"""Run only when named in ``--contenders``: shardpipe-tar with its transport forced
(``loaders.transfer.transport``)."""
SHUFFLE_BUFFER = 1024  # samples, for every contender that has a buffer (shardpipe's default)
SEED = 0


@dataclass(frozen=True, slots=True)
class LoaderSettings:
    batch_size: int
    num_workers: int
    prefetch_factor: int = 4  # make_loader's default, given to every contender
    persistent_workers: bool = True

    def dataloader_kwargs(self) -> dict[str, Any]:
        workers = self.num_workers > 0
        return {
            "num_workers": self.num_workers,
            "collate_fn": collate_samples,
            "pin_memory": torch.cuda.is_available(),
            "prefetch_factor": self.prefetch_factor if workers else None,
            "persistent_workers": self.persistent_workers and workers,
        }


class FileDataset(Dataset[dict[str, Any]]):
    """The common baseline: one ``open()``/``read()`` per sample file, label from its class folder."""

    def __init__(self, tree: Path, files: list[Path]) -> None:
        self.items = [(str(f), str(f.relative_to(tree).with_suffix("")), label_of(f)) for f in files]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        path, key, label = self.items[index]
        with open(path, "rb") as f:
            return {"__key__": key, "bin": f.read(), "cls": label}


class MemoryDataset(IterableDataset[dict[str, Any]]):
    """The ceiling: samples already in RAM, a seeded permutation split over workers, no I/O at all."""

    def __init__(self, samples: list[dict[str, Any]]) -> None:
        self.samples = samples

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        order = np.random.default_rng(SEED).permutation(len(self.samples))[worker::num_workers]
        for i in order.tolist():
            yield self.samples[i]


def load_samples(data: BenchData) -> list[dict[str, Any]]:
    """Every sample's ``__key__``, ``bin`` and ``cls``, read once through shardpipe's tar reader in this
    process (tar is fork-safe); shardpipe's ``__pad__`` flag is left out, as the other contenders have none.
    """
    fields = ("__key__", "bin", "cls")
    return [{f: s[f] for f in fields} for s in ShardedDataset(data.packed("tar"), shuffle=False, seed=SEED)]


def _webdataset_sample(sample: dict[str, Any]) -> dict[str, Any]:
    return {"__key__": sample["__key__"], "bin": sample["bin"], "cls": sample["cls"]}


def build(name: str, data: BenchData, settings: LoaderSettings) -> Iterable[Any]:
    """A fresh loader for contender ``name`` (workers start at its first ``iter()``)."""
    return BUILDERS[name](data, settings)


def _raw_files(data: BenchData, s: LoaderSettings) -> Iterable[Any]:
    dataset = FileDataset(data.tree, data.files())
    sampler: DistributedSampler[dict[str, Any]] = DistributedSampler(
        dataset, num_replicas=1, rank=0, shuffle=True, seed=SEED
    )
    return DataLoader(dataset, batch_size=s.batch_size, sampler=sampler, **s.dataloader_kwargs())


def _lmdb_loop(data: BenchData, s: LoaderSettings) -> Iterable[Any]:
    """The loop a user writes (no shardpipe code): labels parsed per sample, a list collate."""
    dataset = lmdb_loop.LmdbLoopDataset(data.lmdb_loop, labels=True)
    sampler: DistributedSampler[dict[str, Any]] = DistributedSampler(
        dataset, num_replicas=1, rank=0, shuffle=True, seed=SEED
    )
    kwargs = {**s.dataloader_kwargs(), "collate_fn": lmdb_loop.collate_list}
    return DataLoader(dataset, batch_size=s.batch_size, sampler=sampler, **kwargs)


def _webdataset(data: BenchData, s: LoaderSettings) -> Iterable[Any]:
    return webdataset_loader([str(p) for p in data.shard_files("tar")], s)


def webdataset_loader(urls: list[str], s: LoaderSettings, buffer: int = SHUFFLE_BUFFER) -> Iterable[Any]:
    """webdataset's own pipeline over tar shards (paths or ``pipe:`` URLs), set up as its users do."""
    import webdataset as wds

    pipeline = (
        wds.WebDataset(urls, shardshuffle=len(urls), seed=SEED, empty_check=False)
        .shuffle(buffer)
        .map(_webdataset_sample)
        .batched(s.batch_size, collation_fn=collate_samples, partial=True)
    )
    kwargs = s.dataloader_kwargs()
    kwargs.pop("collate_fn")  # batched() already collated
    loader: Iterable[Any] = wds.WebLoader(pipeline, batch_size=None, **kwargs)
    return loader


def _shardpipe(
    format_name: str,
    *,
    check: bool = True,
    transport: Transport = "auto",
    decode: dict[str, str] | None = None,
) -> Callable[[BenchData, LoaderSettings], Iterable[Any]]:
    def build_one(data: BenchData, s: LoaderSettings) -> Iterable[Any]:
        dataset = ShardedDataset(
            data.packed(format_name),
            shuffle=True,
            seed=SEED,
            shuffle_buffer=SHUFFLE_BUFFER,
            check=check,
            decode=decode,
        )
        return shardpipe_loader(dataset, s, transport)

    return build_one


def shardpipe_loader(
    dataset: ShardedDataset, s: LoaderSettings, transport: Transport = "auto"
) -> Iterable[Any]:
    """shardpipe's own loader (``make_loader``) over ``dataset``, with the settings every contender gets."""
    kwargs = s.dataloader_kwargs()
    return make_loader(
        dataset,
        s.batch_size,
        s.num_workers,
        pin_memory=kwargs["pin_memory"],
        persistent_workers=kwargs["persistent_workers"],
        prefetch_factor=kwargs["prefetch_factor"],
        transport=transport,
    )


def _in_memory(data: BenchData, s: LoaderSettings) -> Iterable[Any]:
    return DataLoader(MemoryDataset(load_samples(data)), batch_size=s.batch_size, **s.dataloader_kwargs())


BUILDERS: dict[str, Callable[[BenchData, LoaderSettings], Iterable[Any]]] = {
    "raw-files": _raw_files,
    "webdataset": _webdataset,
    "lmdb-loop": _lmdb_loop,
    "shardpipe-tar": _shardpipe("tar"),
    "shardpipe-lmdb": _shardpipe("lmdb"),
    "shardpipe-tfrecord": _shardpipe("tfrecord"),
    **{name: _shardpipe(name.split("-")[1], decode=CLS_DECODE) for name in CLS_RAW},
    "shardpipe-tar-pipe": _shardpipe("tar", transport="pipe"),
    "shardpipe-tar-ring": _shardpipe("tar", transport="ring"),
    "in-memory": _in_memory,
    **{name: _shardpipe(name.split("-")[1], check=False) for name in CHECK_OFF},
}


def files_read(name: str, data: BenchData) -> list[Path]:
    """What a contender reads from disk, for cold-cache eviction (in-memory reads the tar shards to load)."""
    if name == "raw-files":
        return data.files()
    if name == "lmdb-loop":
        return lmdb_loop.files(data.lmdb_loop)
    format_name = name.split("-")[1] if name.startswith("shardpipe-") else "tar"
    return data.shard_files(format_name, with_index=True)
