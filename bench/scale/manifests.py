"""Manifests of 10^4 to 10^6 shards: what loading one costs a process, and what a ``ShardedDataset``
built on it keeps, with the shards in a table file (what ``shardpipe pack`` writes past
``LISTED_SHARDS``) and listed in the JSON (what it wrote before, measured where it fits in time)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import shardpipe.manifest
import shardpipe.shardtable
from shardpipe.manifest import Manifest, write_manifest
from shardpipe.shardtable import SCHEMA, ShardTable
from shardpipe.storage import open_store

SHARD_SAMPLES = 10_000
LISTED_LIMIT = 10**5
"""The most shards measured listed in JSON: at 10^6 the JSON alone is hundreds of MB."""


def synthetic_table(num_shards: int) -> ShardTable:
    """``num_shards`` tar shards of ``SHARD_SAMPLES`` samples, each with an index, random checksums."""
    names = [f"train/shard-{i:07d}" for i in range(num_shards)]
    digests = np.random.default_rng(0).bytes(64 * num_shards)
    hexes = [digests[32 * i : 32 * i + 32].hex() for i in range(2 * num_shards)]
    table = pa.table(
        {
            "path": [f"{name}.tar" for name in names],
            "samples": np.full(num_shards, SHARD_SAMPLES, dtype=np.int64),
            "bytes": np.full(num_shards, SHARD_SAMPLES * 1024, dtype=np.int64),
            "sha256": hexes[:num_shards],
            "index_path": [f"{name}.idx" for name in names],
            "index_sha256": hexes[num_shards:],
            "keys_xxh3": pa.nulls(num_shards, pa.string()),
            "compressed": pa.nulls(num_shards, SCHEMA.field("compressed").type),
        },
        schema=SCHEMA,
    )
    return ShardTable(table)


def prepare(folder: Path, num_shards: int, *, listed: bool) -> Path:
    """A dataset folder holding only the manifest (and its table file) of ``num_shards`` shards."""
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "manifest.json").exists():
        return folder
    manifest = Manifest(
        format="tar", fields=("bin",), splits={"train": synthetic_table(num_shards)}, split_rule={}
    )
    limit = shardpipe.shardtable.LISTED_SHARDS
    shardpipe.shardtable.LISTED_SHARDS = num_shards if listed else limit  # the JSON form, as packs had
    try:
        write_manifest(open_store(folder), manifest)
    finally:
        shardpipe.shardtable.LISTED_SHARDS = limit
    return folder


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(folder: str, num_shards: int, listed: bool) -> dict[str, Any]:
    """One cold run (the caller gives it a fresh process): load the manifest; then build a dataset over
    it, plan the last worker's first window from the counts alone and open that window's first entry,
    as a DataLoader worker does at an epoch's start."""
    from loaders import ShardedDataset
    from loaders.planning import plan_windows
    from loaders.planning.elastic import epoch_samples

    ShardTable.decode(pa.py_buffer(synthetic_table(1).encode()))  # imports and first calls, not counted
    baseline = _rss_mb()
    started = time.perf_counter()
    manifest = shardpipe.manifest.load_manifest(folder)
    loaded = time.perf_counter() - started
    del manifest
    started = time.perf_counter()
    dataset = ShardedDataset(folder, rank=7, world_size=8)
    config = dataset.plan_config(8)
    sequence = epoch_samples(dataset.shard_sizes, config, (), 0)
    first = plan_windows(sequence, config, epoch=0, rank=7, worker_index=7)[0]
    entry = dataset.shards[first.runs[0].shard_index]
    ready = time.perf_counter() - started
    return {
        "shards": num_shards,
        "form": "listed in JSON" if listed else "table file",
        "files_mb": sum(f.stat().st_size for f in Path(folder).iterdir()) / 2**20,
        "load_s": loaded,
        "dataset_first_window_s": ready,
        "peak_rss_growth_mb": _hwm_mb() - baseline,
        "rss_growth_mb": _rss_mb() - baseline,
        "opened": entry.path,
    }
