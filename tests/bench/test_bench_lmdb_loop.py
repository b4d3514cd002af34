"""The ``lmdb-loop`` baseline reader: what it stores, and that it reads per process, never across a fork."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from torch.utils.data import DataLoader, DistributedSampler

from bench.io import contenders, lmdb_loop
from bench.io.data import QUICK_PROFILES
from bench.io.data import Dataset as BenchData
from loaders.batches import collate_samples

pytestmark = pytest.mark.bench

SAMPLES = [(f"c{i % 3}/{i:04d}", b"%d" % (i % 3), bytes([i]) * (100 + i)) for i in range(50)]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    count = lmdb_loop.write(tmp_path / "db", iter(SAMPLES), sum(len(s[2]) for s in SAMPLES))
    assert count == len(SAMPLES)
    return tmp_path / "db"


def test_samples_read_back_by_index(path: Path) -> None:
    dataset = lmdb_loop.LmdbLoopDataset(path)
    assert len(dataset) == len(SAMPLES)
    assert dataset._env is None  # nothing opened until a process reads
    for index in (0, 17, 49):
        key, cls, data = SAMPLES[index]
        assert dataset[index] == {"__key__": key, "cls": cls, "bin": data}
    with pytest.raises(IndexError, match="no sample 50"):
        dataset[50]
    assert pickle.loads(pickle.dumps(dataset))._env is None  # a spawned worker opens its own
    assert [p.name for p in lmdb_loop.files(path)] == ["data.mdb", "lock.mdb"]


def test_the_layout_is_not_pickle() -> None:
    value = lmdb_loop.encode("a/1", b"7", b"xyz")
    assert value == b"\x03\x00\x00\x00\x01\x00\x00\x00a/17xyz"
    assert lmdb_loop.decode(value) == {"__key__": "a/1", "cls": b"7", "bin": b"xyz"}


@pytest.mark.timeout(120)
def test_workers_read_every_sample_once(path: Path) -> None:
    dataset = lmdb_loop.LmdbLoopDataset(path)
    dataset[0]  # the main process opens its own environment first: the workers must not reuse it
    sampler: DistributedSampler[dict[str, object]] = DistributedSampler(
        dataset, num_replicas=1, rank=0, seed=0
    )
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=2, collate_fn=collate_samples)
    keys = [key for batch in loader for key in batch["__key__"]]
    assert sorted(keys) == sorted(s[0] for s in SAMPLES)
    assert keys != [s[0] for s in SAMPLES]  # shuffled


def test_cold_runs_evict_the_lmdb_loop_files(tmp_path: Path) -> None:
    data = BenchData(QUICK_PROFILES["small"], tmp_path)
    lmdb_loop.write(data.lmdb_loop, iter(SAMPLES), 10_000)
    assert contenders.files_read("lmdb-loop", data) == [
        data.lmdb_loop / "data.mdb",
        data.lmdb_loop / "lock.mdb",
    ]
    assert "lmdb-loop" in contenders.NAMES
