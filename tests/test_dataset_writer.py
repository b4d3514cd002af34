"""DatasetWriter: samples written from Python become a dataset that verify, inspect and the loaders treat
exactly like a packed one, cut by the same rule, crash-safe, to a folder or a bucket."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loaders import ShardedDataset
from shardpipe import DatasetWriter, PackOptions, inspect, load_manifest, pack, verify
from shardpipe.errors import UsageError
from shardpipe.packing.output import OutputNotEmptyError
from shardpipe.packing.plan import SampleTooLargeError
from shardpipe.packing.samples import SampleError
from shardpipe.storage import open_store
from testkit.servers import S3Server
from tests.datagen import make_tree
from tests.test_pack import read_back, read_shards

FORMATS = ["tar", "lmdb", "tfrecord"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_writing_a_packs_samples_in_its_order_gives_its_shards(tmp_path: Path, fmt: str) -> None:
    """The same manifest entries, indexes and per-sample checksums as pack, byte for byte."""
    make_tree(tmp_path / "src", 50)
    packed = pack(tmp_path / "src", tmp_path / "packed", PackOptions(format=fmt, max_samples=12), quiet=True)
    with DatasetWriter(tmp_path / "written", fmt, max_samples=12) as writer:
        for shard in read_shards(tmp_path / "packed")["train"]:
            for key, fields in shard.items():
                writer.write({"__key__": key, **fields})
    written = load_manifest(tmp_path / "written")
    assert written.splits == packed.manifest.splits  # paths, counts, sizes, sha256s of shards and indexes
    assert (
        written.fields == packed.manifest.fields
        and written.sample_checksum == packed.manifest.sample_checksum
    )
    assert verify(tmp_path / "written", quiet=True) == []
    assert inspect(tmp_path / "written")["splits"]["train"]["samples"] == 50


def test_splits_per_sample_limits_and_the_loaders(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with DatasetWriter(out, "lmdb", split="train", max_bytes=1000) as writer:
        for i in range(40):
            writer.write({"__key__": f"k/{i:03d}", "bin": bytes(100), "cls": b"%d" % (i % 3)},
                         split="val" if i % 4 == 0 else None)  # fmt: skip
    manifest = writer.manifest
    assert manifest is not None and set(manifest.splits) == {"train", "val"}
    counts = [s.num_samples for shards in manifest.splits.values() for s in shards]
    assert sum(counts) == 40 and max(counts) == 9  # 9 x 101 bytes fit in 1000, a tenth would not
    got = read_back(out)
    assert sorted(got["val"]) == [f"k/{i:03d}" for i in range(0, 40, 4)]
    dataset = ShardedDataset(out, "train", rank=0, world_size=1)
    assert sorted(s["__key__"] for s in dataset) == sorted(got["train"])
    assert manifest.order["method"] == "written"


def test_bad_samples_are_refused_by_name(tmp_path: Path) -> None:
    writer = DatasetWriter(tmp_path / "out", "tar", max_bytes=100)
    writer.write({"__key__": "a/1", "bin": b"x"})
    for sample, error, message in (
        ({"__key__": "a/1", "bin": b"y"}, SampleError, "written before"),
        ({"__key__": "a/2", "txt": b"y"}, SampleError, "every sample must have the same fields"),
        ({"__key__": "a/3", "bin": "text"}, SampleError, "expected bytes"),
        ({"__key__": "a/4.jpg", "bin": b"y"}, SampleError, "holds a dot"),
        ({"__key__": "a/5", "bin": bytes(101)}, SampleTooLargeError, "max_bytes=100"),
    ):
        with pytest.raises(error, match=message):
            writer.write(sample)
    with pytest.raises(UsageError, match="split name"):
        writer.write({"__key__": "a/6", "bin": b"y"}, split="../up")
    writer.close()
    with pytest.raises(UsageError, match="closed"):
        writer.write({"__key__": "a/7", "bin": b"y"})
    with pytest.raises(OutputNotEmptyError):
        DatasetWriter(tmp_path / "out", "tar")
    with DatasetWriter(tmp_path / "out", "tar", overwrite=True) as replacing:
        replacing.write({"__key__": "b/1", "bin": b"z"})
    assert read_back(tmp_path / "out") == {"train": {"b/1": {"bin": b"z"}}}  # the old dataset is gone
    with pytest.raises(UsageError, match="nothing was written"):
        DatasetWriter(tmp_path / "empty", "tar").close()


def test_an_error_in_the_block_leaves_no_manifest_and_no_partial_shard(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with (
        pytest.raises(RuntimeError, match="the producer failed"),
        DatasetWriter(out, "tar", max_samples=10) as w,
    ):
        for i in range(25):
            w.write({"__key__": f"k/{i:03d}", "bin": b"%d" % i})
        raise RuntimeError("the producer failed")
    assert not (out / "manifest.json").exists()
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert names == [".shardpipe-journal.jsonl", "train/shard-000000.tar", "train/shard-000000.tar.idx",
                     "train/shard-000001.tar", "train/shard-000001.tar.idx"]  # fmt: skip


PRODUCER = """
import sys, time
from shardpipe import DatasetWriter
with DatasetWriter(sys.argv[1], "tfrecord", max_samples=50) as writer:
    for i in range(100_000):
        writer.write({"__key__": f"k/{i:06d}", "bin": bytes(2000)})
        if i == 120:
            print("ready", flush=True)
"""


def test_a_killed_writer_leaves_only_whole_shards(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", PRODUCER, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    assert not (out / "manifest.json").exists()
    finals = sorted(p for p in (out / "train").iterdir() if ".tmp-" not in p.name and p.suffix == ".tfrecord")
    assert len(finals) >= 2
    journal = (out / ".shardpipe-journal.jsonl").read_text().splitlines()[1:]
    assert len(journal) >= len(finals) - 1  # killed between a publish and its journal line at most


def test_a_writer_into_a_bucket(tmp_path: Path, s3: S3Server, s3_root: str) -> None:
    options = s3.storage_options()
    with DatasetWriter(s3_root, "tar", max_samples=7, storage_options=options) as writer:
        for i in range(20):
            writer.write({"__key__": f"k/{i:03d}", "bin": b"%d" % i})
    assert verify(s3_root, quiet=True, storage_options=options) == []
    store = open_store(s3_root, storage_options=options)
    assert "manifest.json" in store.list_keys() and not [k for k in store.list_keys() if ".tmp-" in k]
    assert load_manifest(s3_root, options).splits["train"][-1].num_samples == 6
