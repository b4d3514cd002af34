"""ShardedDataset over shards in object storage: the loopback S3 and HTTP servers, through the cache.

The same order as the local copy for the same seed and epoch, in one process, with DataLoader workers
under fork and spawn, and on 3 gloo ranks; every sample exactly once under injected faults; a corrupted
object is a clear error and is not cached; a cache budget below the dataset is kept and still delivers.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from loaders import RemoteOptions, ShardedDataset, make_loader
from shardpipe.errors import CorruptShardError
from shardpipe.manifest import load_manifest
from shardpipe.storage import open_store
from testkit.distributed import run_ranks
from testkit.servers import Faults, S3Server
from tests.datagen import pack_dataset


def upload(local: Path, url: str, storage_options: dict[str, Any] | None = None) -> None:
    store = open_store(url, storage_options=storage_options)
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        store.put_file(path.relative_to(local).as_posix(), path)


def keys(dataset: ShardedDataset, epoch: int = 1) -> list[tuple[str, bool]]:
    dataset.set_epoch(epoch)
    return [(s["__key__"], s["__pad__"]) for s in dataset]


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack_dataset(tmp_path_factory.mktemp("remote"), "tar", 47, max_samples=7)


@pytest.fixture
def bucket(s3: S3Server, s3_root: str, local: Path) -> tuple[str, dict[str, Any]]:
    options = s3.storage_options()
    upload(local, s3_root, options)
    return s3_root, options


def test_s3_and_https_read_the_local_order(
    local: Path, bucket: tuple[str, dict[str, Any]], http_dir: tuple[Path, str], tmp_path: Path
) -> None:
    url, options = bucket
    expected = keys(ShardedDataset(local, rank=1, world_size=2, seed=3))
    remote = ShardedDataset(
        url,
        rank=1,
        world_size=2,
        seed=3,
        remote=RemoteOptions(storage_options=options, cache_dir=tmp_path / "c"),
    )
    assert keys(remote) == expected
    folder, http_url = http_dir
    shutil.copytree(local, folder, dirs_exist_ok=True)
    by_manifest = ShardedDataset(
        f"{http_url}/manifest.json",
        rank=1,
        world_size=2,
        seed=3,
        remote=RemoteOptions(cache_dir=tmp_path / "h"),
    )
    assert keys(by_manifest) == expected
    assert remote.manifest == load_manifest(local)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_read_s3_under_fork_and_spawn(
    local: Path, bucket: tuple[str, dict[str, Any]], tmp_path: Path, context: str
) -> None:
    url, options = bucket

    def batches(path: str | Path, remote: RemoteOptions | None = None) -> list[list[str]]:
        dataset = ShardedDataset(path, rank=0, world_size=1, seed=1, remote=remote)
        loader = make_loader(dataset, 5, num_workers=2, multiprocessing_context=context)
        loader.set_epoch(2)
        return [b["__key__"] for b in loader]

    assert batches(url, RemoteOptions(storage_options=options, cache_dir=tmp_path)) == batches(local)


def test_every_sample_once_under_injected_faults(
    s3: S3Server, local: Path, bucket: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, options = bucket
    s3.control.set_faults(Faults(rate=0.1, seed=4, slow_s=0.05))
    samples = keys(
        ShardedDataset(
            url, rank=0, world_size=1, remote=RemoteOptions(storage_options=options, cache_dir=tmp_path)
        )
    )
    s3.control.set_faults(Faults())
    assert sorted(samples) == sorted(keys(ShardedDataset(local, rank=0, world_size=1)))
    assert len({k for k, _ in samples}) == 47


def test_a_corrupted_object_is_a_clear_error_and_is_not_cached(
    local: Path, bucket: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, options = bucket
    entry = load_manifest(local).splits["train"][2]
    store = open_store(url, storage_options=options)
    data = bytearray((local / entry.path).read_bytes())
    data[600] ^= 0xFF
    store.put(entry.path, bytes(data))
    dataset = ShardedDataset(
        url,
        rank=0,
        world_size=1,
        shuffle=False,
        remote=RemoteOptions(storage_options=options, cache_dir=tmp_path),
    )
    with pytest.raises(CorruptShardError, match=entry.path):
        list(dataset)
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size]
    assert not [p for p in files if entry.sha256 in p.name]  # nothing unchecked left in the cache
    assert not [p for p in files if p.read_bytes() == bytes(data)]


def test_a_budget_below_the_dataset_is_kept_and_still_delivers(
    local: Path, bucket: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, options = bucket
    shards = load_manifest(local).splits["train"]
    budget = 2 * max(s.num_bytes for s in shards)  # well below the 7 shards' total
    assert budget < sum(s.num_bytes for s in shards)
    dataset = ShardedDataset(
        url,
        rank=0,
        world_size=1,
        remote=RemoteOptions(storage_options=options, cache_dir=tmp_path, cache_limit=budget),
    )
    dataset.set_epoch(1)
    seen, peak = [], 0
    for sample in dataset:
        seen.append(sample["__key__"])
        peak = max(
            peak, sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".json")
        )
    assert len(set(seen)) == 47 and peak <= budget


def read_three_ranks(rank: int, world_size: int, url: str, options: dict[str, Any], cache: str) -> Any:
    dataset = ShardedDataset(url, seed=11, remote=RemoteOptions(storage_options=options, cache_dir=cache))
    loader = make_loader(dataset, batch_size=4, num_workers=2)
    loader.set_epoch(1)
    return [b["__key__"] for b in loader]


@pytest.mark.timeout(240)
def test_three_gloo_ranks_read_s3_in_the_local_order(
    s3: S3Server, local: Path, bucket: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    """One node's cache shared by 3 ranks x 2 workers: the same batches as the local copy, per rank,
    and no shard downloaded twice (every file of the dataset is fetched at most once)."""
    url, options = bucket
    s3.control.reset_counts()
    results = run_ranks(read_three_ranks, 3, url, options, str(tmp_path), timeout=200)
    shards = load_manifest(local).splits["train"]
    assert (
        s3.control.bytes_sent
        < sum(s.num_bytes for s in shards)
        + sum(p.stat().st_size for p in local.rglob("*.idx"))
        + 6 * (local / "manifest.json").stat().st_size
        + 64 * 1024
    )  # responses' headers and listings
    for rank, batches in enumerate(results):
        loader = make_loader(ShardedDataset(local, seed=11, rank=rank, world_size=3), 4, num_workers=2)
        loader.set_epoch(1)
        assert batches == [b["__key__"] for b in loader]


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_cache_false_reads_by_coalesced_byte_ranges_with_the_same_checks(
    s3: S3Server, s3_root: str, tmp_path: Path, fmt: str
) -> None:
    local = pack_dataset(tmp_path / "packs", fmt, 47, max_samples=25)  # 2 shards
    options = s3.storage_options()
    upload(local, s3_root, options)
    s3.control.reset_counts()
    remote = ShardedDataset(
        s3_root, rank=0, world_size=1, seed=5, remote=RemoteOptions(storage_options=options, cache=False)
    )
    assert keys(remote) == keys(ShardedDataset(local, rank=0, world_size=1, seed=5))
    shard_gets = sum(s3.control.count("GET", e.path) for e in load_manifest(local).splits["train"])
    num_spans = 47 // 4 + 2  # blocks of 4 samples, cut at shard ends: far more spans than requests
    assert 0 < shard_gets < num_spans  # a window's neighbouring spans travel in one request
    entry = load_manifest(local).splits["train"][1]
    data = bytearray((local / entry.path).read_bytes())
    data[700] ^= 0xFF
    open_store(s3_root, storage_options=options).put(entry.path, bytes(data))
    with pytest.raises(CorruptShardError, match=entry.path):
        list(
            ShardedDataset(
                s3_root, rank=0, world_size=1, remote=RemoteOptions(storage_options=options, cache=False)
            )
        )


def test_cache_false_refuses_lmdb(s3: S3Server, s3_root: str, tmp_path: Path) -> None:
    from shardpipe.errors import UsageError

    local = pack_dataset(tmp_path, "lmdb", 10)
    options = s3.storage_options()
    upload(local, s3_root, options)
    with pytest.raises(UsageError, match="cannot be read by byte ranges"):
        list(
            ShardedDataset(
                s3_root, rank=0, world_size=1, remote=RemoteOptions(storage_options=options, cache=False)
            )
        )


def test_the_cache_prefetches_indexes_with_their_shards(
    bucket: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    """A reader loads a shard's index before the shard: both are in the plan the cache prefetches by."""
    url, options = bucket
    dataset = ShardedDataset(
        url, remote=RemoteOptions(storage_options=options, cache_dir=tmp_path / "c", prefetch=2)
    )
    entries = dataset.shards[:3]
    dataset.source.plan(entries)
    cache = dataset.source._cache
    assert cache is not None
    planned = [ref.path for ref in cache._plan]
    assert planned == [path for e in entries for path in (e.index_path, e.path)]
    with dataset.source.shard(entries[0]):  # reading shard 0 prefetches index 1 and shard 1
        cache.wait_prefetched(timeout=30)
    assert all(cache.directory.final(e.sha256).exists() for e in entries[:2])
    assert cache.directory.final(entries[1].index_sha256 or "").exists()
    assert not cache.directory.final(entries[2].sha256).exists()


@pytest.mark.parametrize("limit", [None, "30KB"])
def test_readers_stay_open_unless_the_cache_has_a_budget(
    local: Path,
    bucket: tuple[str, dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    limit: str | None,
) -> None:
    """Without a budget nothing evicts a cached shard, so its reader stays open across windows and epochs
    as a local shard's does; under a budget every read goes through the cache (held against eviction)."""
    from loaders.reading.source import DatasetSource

    url, options = bucket
    opened: list[str] = []
    shard = DatasetSource.shard

    def counting(self: DatasetSource, entry: Any) -> Any:
        opened.append(entry.path)
        return shard(self, entry)

    monkeypatch.setattr(DatasetSource, "shard", counting)
    dataset = ShardedDataset(
        url,
        shuffle_buffer=8,
        block_size=2,
        remote=RemoteOptions(storage_options=options, cache_dir=tmp_path / "c", cache_limit=limit),
    )
    every = sorted(key for key, pad in keys(ShardedDataset(local, shuffle=False)) if not pad)
    for epoch in (1, 2):
        assert sorted(key for key, pad in keys(dataset, epoch) if not pad) == every
    if limit is None:
        assert sorted(opened) == sorted(entry.path for entry in dataset.shards)  # once each
    else:
        assert len(opened) > 2 * len(dataset.shards)  # every read of a window
