"""Writing one shard: the unit an executor runs, its entry, and what a failed write leaves."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from shardpipe.formats import get_format
from shardpipe.formats.layout import ShardIndex
from shardpipe.packing import PackOptions, shard_writing
from shardpipe.packing.plan import ShardJob, plan_jobs
from shardpipe.packing.shard_writing import ShardFile, SourceFileError, write_shard
from shardpipe.sources import scan_source
from shardpipe.storage import open_store
from shardpipe.storage.files import sha256_file
from tests.datagen import make_tree


def _jobs(src: Path, fmt: str = "tar", **options: object) -> list[ShardJob]:
    table = scan_source(src, labels="dirname").table
    return plan_jobs(table, get_format(fmt).suffix, PackOptions(format=fmt, labels="dirname", **options))  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["tar", "lmdb", "tfrecord"])
def test_entry_describes_the_shard_written(tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = make_tree(tmp_path / "src", 30, size=300)
    monkeypatch.setattr(shard_writing, "BATCH_BYTES", 1000)  # several batches per shard, one reused buffer
    (job,) = _jobs(tmp_path / "src", fmt)
    entry = write_shard(job, open_store(tmp_path / "out"), fmt)
    shard = tmp_path / "out" / job.relpath
    assert entry.path == job.relpath and entry.num_samples == 30
    assert entry.num_bytes == shard.stat().st_size and entry.sha256 == sha256_file(shard)
    index = None
    if entry.index_path is not None:
        assert entry.index_sha256 == sha256_file(tmp_path / "out" / entry.index_path)
        index = ShardIndex.read(tmp_path / "out" / entry.index_path, 30, job.samples.fields)
    got = dict(get_format(fmt).read(shard, 0, 30, index))
    assert list(got) == job.samples.keys  # the plan's order, not key order
    for key, fields in got.items():
        assert fields["bin"] == expected[key]["bin"] and fields["txt"] == expected[key]["txt"]
    assert not list((tmp_path / "out").rglob("*.tmp-*"))


def test_job_pickles_and_any_process_writes_the_same_shard(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 40)
    jobs = _jobs(tmp_path / "src", max_samples=15)
    assert len(jobs) == 3
    here = [write_shard(job, open_store(tmp_path / "here"), "tar") for job in jobs]
    with ProcessPoolExecutor(2) as pool:
        there_store = [open_store(tmp_path / "there")] * 3
        there = list(pool.map(write_shard, jobs, there_store, ["tar"] * 3, timeout=60))
    assert there == here
    assert pickle.loads(pickle.dumps(jobs[0])).samples.keys == jobs[0].samples.keys
    for entry in here:
        assert (tmp_path / "here" / entry.path).read_bytes() == (tmp_path / "there" / entry.path).read_bytes()


def test_file_changed_since_the_scan_is_named(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 4)
    (job,) = _jobs(tmp_path / "src")
    with (tmp_path / "src" / "cls1" / "00001.txt").open("ab") as grown:
        grown.write(b"more")
    with pytest.raises(
        SourceFileError, match=r"00001\.txt changed while packing: scanned 101 bytes, read 102"
    ):
        write_shard(job, open_store(tmp_path / "out"), "tar")
    assert not list((tmp_path / "out").rglob("*.tar*"))


def test_unreadable_file_is_named_and_the_error_pickles(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 4)
    (job,) = _jobs(tmp_path / "src")
    (tmp_path / "src" / "cls0" / "00000.bin").unlink()
    with pytest.raises(SourceFileError) as caught:
        write_shard(job, open_store(tmp_path / "out"), "lmdb")
    error = caught.value
    assert not error.changed and error.path.endswith("cls0/00000.bin")
    assert "'cls0/00000'" in str(error) and "train/shard-000000.tar" in str(error)
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.path, again.changed) == (str(error), error.path, False)
    assert not list((tmp_path / "out").rglob("shard-*"))


@pytest.mark.parametrize("fmt", ["tar", "lmdb", "tfrecord"])
def test_samples_added_one_by_one_write_the_bytes_of_batches_in_order(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``add`` gathers samples into the writer batches ``write_shard`` makes of files (so the same bytes),
    and a ``write_batch`` after some ``add`` calls comes after them; leaving the block unfinished leaves
    nothing."""
    expected = make_tree(tmp_path / "src", 30, size=300)
    monkeypatch.setattr(shard_writing, "BATCH_BYTES", 1000)  # several batches per shard
    (job,) = _jobs(tmp_path / "src", fmt)
    entry = write_shard(job, open_store(tmp_path / "batches"), fmt)
    names = job.samples.fields
    index = (
        None
        if entry.index_path is None
        else ShardIndex.read(tmp_path / "batches" / entry.index_path, 30, names)
    )
    written = dict(get_format(fmt).read(tmp_path / "batches" / job.relpath, 0, 30, index))
    samples = [(key, [bytes(written[key][name]) for name in names]) for key in job.samples.keys]
    with ShardFile(job.relpath, open_store(tmp_path / "added"), fmt, names) as shard:
        for key, values in samples[:20]:
            shard.add(key, values, sum(map(len, values)))
        rest = samples[20:]
        shard.write_batch([k for k, _ in rest], names, [[v[j] for _, v in rest] for j in range(len(names))])
        added = shard.finish()
    assert added.num_samples == 30
    if fmt != "lmdb":  # LMDB's pages follow its commits, which follow the calls: compared by content below
        assert added.sha256 == entry.sha256
    got = dict(get_format(fmt).read(tmp_path / "added" / job.relpath, 0, 30, None if fmt == "lmdb" else
               ShardIndex.read(tmp_path / "added" / f"{job.relpath}.idx", 30, names)))  # fmt: skip
    assert list(got) == job.samples.keys and all(got[k]["bin"] == expected[k]["bin"] for k in got)
    with pytest.raises(RuntimeError), ShardFile("x/shard.tar", open_store(tmp_path / "left"), fmt) as s:
        s.add("a", [b"1"], 1)
        raise RuntimeError("stop")
    assert not [p for p in (tmp_path / "left").rglob("*") if p.is_file()]
