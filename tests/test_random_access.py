"""ShardedMapDataset and ``shardpipe get``: any sample by position or key, locally and from S3.

Every format gives the streaming dataset's samples at the same positions (single, batched, repeated,
negative); a key finds its sample; bad positions and keys are the project's IndexError and KeyError; a
damaged sample names its shard, or is replaced and flagged under ``on_error="skip"``; remotely a sample
costs one ranged request plus its shard's index once, never the whole shard.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from click.testing import CliRunner
from torch.utils.data import DataLoader

from loaders import RemoteOptions, ShardedDataset
from loaders.random_access import ShardedMapDataset
from loaders.reading import readers as readers_module
from loaders.reading.keys import KeyTable
from loaders.reading.readers import open_limit
from loaders.reading.source import DatasetSource
from shardpipe.cli import main
from shardpipe.errors import CorruptShardError, DataError, SampleIndexError, SampleKeyError, ShardpipeError
from shardpipe.formats import get_format
from shardpipe.formats.layout import ShardIndex, index_bytes
from shardpipe.manifest import load_manifest
from testkit.servers import S3Server
from tests.datagen import make_tree, pack_dataset
from tests.test_dataset import damage
from tests.test_dataset_remote import upload
from tests.test_formats import damage_sample

FORMATS = ("tar", "tfrecord", "lmdb")


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("random")
    return {fmt: pack_dataset(root, fmt, 80, max_samples=7, order="hashed") for fmt in FORMATS}


def streamed(path: Path) -> list[dict[str, Any]]:
    return list(ShardedDataset(path, shuffle=False, decode={"cls": "cls"}))


@pytest.mark.parametrize("fmt", FORMATS)
def test_positions_give_the_streamed_samples(packed: dict[str, Path], fmt: str) -> None:
    expected = streamed(packed[fmt])
    ds = ShardedMapDataset(packed[fmt], decode={"cls": "cls"})
    assert len(ds) == len(expected) == 80
    assert [ds[i] for i in range(80)] == expected
    wanted = [29, 0, 3, 3, -1, 14, 7, 8, 9]  # unsorted, repeated, negative, across shards
    assert ds.__getitems__(wanted) == [expected[i] for i in wanted]
    scattered = list(range(78, -1, -2))  # 40 runs of one sample: read and cut in one buffer
    assert ds.__getitems__(scattered) == [expected[i] for i in scattered]
    batch = ds.get_batch(wanted)
    assert batch["__key__"] == [expected[i]["__key__"] for i in wanted]
    assert batch["cls"].tolist() == [expected[i]["cls"] for i in wanted]
    assert batch["bin"].tolist() == [expected[i]["bin"] for i in wanted]
    assert not batch["__pad__"].any()
    assert ds.__getitems__([]) == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_raw_gets_read_one_by_one_are_those_read_as_a_window(packed: dict[str, Path], fmt: str) -> None:
    """Without decoders a batch of ints is read sample by sample (``Format.read_samples``); any other index
    type, and a decoded batch, as a window: the same samples either way."""
    expected = list(ShardedDataset(packed[fmt], shuffle=False))
    ds = ShardedMapDataset(packed[fmt])
    wanted = [29, 0, 3, 3, -1, 14, 7, 8, 9]
    assert ds.__getitems__(wanted) == [expected[i] for i in wanted]
    assert ds.__getitems__(np.array(wanted)) == [expected[i] for i in wanted]  # numpy ints: as a window
    assert list(ds.read(wanted).samples()) == [expected[i] for i in wanted]
    assert [ds[i] for i in range(80)] == expected


def test_gets_over_more_shards_than_stay_open_reopen_them(
    packed: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers close least recently used first, and nothing is read through a closed one (its map
    would be refused as closed)."""
    monkeypatch.setattr(readers_module, "MAX_OPEN_SHARDS", 3)
    expected = list(ShardedDataset(packed["tar"], shuffle=False))
    ds = ShardedMapDataset(packed["tar"])
    walk = [*range(0, 80, 5), *range(79, -1, -6)]  # every shard of 12, twice
    assert [ds[i] for i in walk] == [expected[i] for i in walk]
    assert ds.__getitems__(walk) == [expected[i] for i in walk]  # more shards than stay open at once
    assert ds._readers.limit == len(ds._readers._open) == len(ds._readers._indexes) == 3


def test_fewer_shards_stay_open_where_their_indexes_are_large(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers_module, "MAX_OPEN_SHARDS", 1024)
    monkeypatch.setattr(readers_module, "INDEX_BYTES", 256 << 20)
    assert open_limit(index_bytes(1_000, 2, 2)) == 1024  # 64 KB an index
    assert open_limit(index_bytes(20_000, 2, 2)) == (256 << 20) // index_bytes(20_000, 2, 2) < 1024
    assert open_limit(index_bytes(100_000, 2, 2)) == 64  # never fewer
    assert open_limit(0) == 1024  # LMDB: no index to hold


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_a_shard_cut_short_while_open_names_the_first_sample_it_lost(tmp_path: Path, fmt: str) -> None:
    out = pack_dataset(tmp_path, fmt, 20, max_samples=10)
    ds = ShardedMapDataset(out)
    kept = ds[16]  # shard 1 open and mapped
    os.truncate(out / ds.shards[1].path, int(ds._readers.index(1).offsets[7]))  # samples 7-9 cut off
    assert ds.__getitems__([10, 16]) == [ds[10], kept]  # samples the file still holds
    with pytest.raises(CorruptShardError, match=f"shard-000001.{fmt}.*sample 8.*cut short"):
        ds.__getitems__([10, 19, 18])


def test_keys_find_their_samples_and_bad_lookups_are_project_errors(packed: dict[str, Path]) -> None:
    ds = ShardedMapDataset(packed["tar"])
    for i, sample in enumerate(streamed(packed["tar"])):
        assert ds.position_of(sample["__key__"]) == i
    assert ds.get("cls1/00004")["__key__"] == "cls1/00004"
    with pytest.raises(SampleKeyError, match="no sample with key 'cls1/99999'") as missing:
        ds.get("cls1/99999")
    assert isinstance(missing.value, KeyError) and isinstance(missing.value, ShardpipeError)
    for wrong in (1.5, True, "3"):
        with pytest.raises(TypeError, match="must be ints"):
            ds[wrong]  # type: ignore[index]
    for bad in (80, -81):
        with pytest.raises(SampleIndexError, match=f"sample {bad} is out of range.*80 samples") as out:
            ds[bad]
        assert isinstance(out.value, IndexError)


def test_a_hash_collision_costs_a_read_not_a_wrong_answer() -> None:
    table = KeyTable.build(["a", "b", "c"])
    assert [table.candidates(k) for k in "abc"] == [[0], [1], [2]]
    assert table.candidates("zz") == []


def test_the_state_is_the_epoch_and_refuses_another_dataset(packed: dict[str, Path]) -> None:
    ds = ShardedMapDataset(packed["tar"], seed=5)
    ds.set_epoch(3)
    state = json.loads(json.dumps(ds.state_dict()))
    again = ShardedMapDataset(packed["tar"], seed=5)
    again.load_state_dict(state)
    assert again.epoch == 3
    with pytest.raises(ValueError, match="found seed=5 in the saved state, expected 6"):
        ShardedMapDataset(packed["tar"], seed=6).load_state_dict(state)


def test_a_dataloader_with_any_sampler_reads_each_sample_once(packed: dict[str, Path]) -> None:
    ds = ShardedMapDataset(packed["lmdb"], decode={"cls": "cls"})
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, collate_fn=list)
    keys = [sample["__key__"] for batch in loader for sample in batch]
    assert sorted(keys) == sorted(s["__key__"] for s in streamed(packed["lmdb"]))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_damaged_sample_names_its_shard_or_is_replaced_and_flagged(tmp_path: Path, fmt: str) -> None:
    out = pack_dataset(tmp_path, fmt, 20, max_samples=10)
    damage(out, fmt)  # shard 1: sample 3 (the whole shard for LMDB)
    with pytest.raises(DataError, match=f"shard-000001.{fmt}"):
        ShardedMapDataset(out)[13]
    skipping = ShardedMapDataset(out, on_error="skip")
    got = skipping.__getitems__([13, 2])
    assert got[0]["__pad__"] and not got[1]["__pad__"]
    assert got[0]["__key__"] == got[1]["__key__"]  # the unreadable slot holds a readable sample's copy
    alone = skipping[13]  # nothing readable beside it: the dataset's first readable sample stands in
    assert alone["__pad__"] and alone["__key__"] == ShardedMapDataset(out)[0]["__key__"]


def test_remote_gets_cost_one_ranged_request_and_the_index_once(
    packed: dict[str, Path], s3: S3Server, s3_root: str, tmp_path: Path
) -> None:
    options = s3.storage_options()
    upload(packed["tar"], s3_root, options)
    local = ShardedMapDataset(packed["tar"])
    remote = ShardedMapDataset(
        s3_root, remote=RemoteOptions(storage_options=options, cache_dir=tmp_path / "cache")
    )
    shard = remote.shards[1]
    s3.control.reset_counts()
    assert remote[8] == local[8] and remote[10] == local[10]  # two samples of shard 1
    assert s3.control.count("GET", shard.path) == 2  # one ranged request each, no download
    assert s3.control.count("GET", str(shard.index_path)) == 1
    assert s3.control.bytes_sent < shard.num_bytes
    s3.control.reset_counts()
    wanted = [0, 1, 2, 15, 16, 29]  # three shards in one batch: one request per shard
    assert remote.__getitems__(wanted) == local.__getitems__(wanted)
    shards = [remote.shards[i] for i in (0, 2, 4)]
    assert sum(s3.control.count("GET", shard.path) for shard in shards) == 3
    # their indexes, fetched together before the shards open: once each
    assert [s3.control.count("GET", str(shard.index_path)) for shard in shards] == [1, 1, 1]
    assert remote.get("cls2/00005") == local.get("cls2/00005")


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_a_key_that_is_not_utf8_is_named_when_checks_are_off(tmp_path: Path, fmt: str) -> None:
    """With checks off nothing catches a damaged key before it is decoded: the error still names it."""
    out = pack_dataset(tmp_path, fmt, 20, max_samples=10)
    manifest = load_manifest(out)
    entry = manifest.splits["train"][1]
    index = ShardIndex.read(out / str(entry.index_path), entry.num_samples, manifest.fields)
    shard = out / entry.path
    data = bytearray(shard.read_bytes())
    data[int(index.key_starts[3])] = 0xFF  # sample 3's key
    shard.write_bytes(bytes(data))
    ds = ShardedMapDataset(out, check=False)
    with pytest.raises(DataError, match=f"shard-000001.{fmt}.*sample 3.*key is not UTF-8"):
        ds.__getitems__([0, 13, 19])
    assert ds.__getitems__([0, 19])[1]["__key__"] == ds[19]["__key__"]


def test_a_batchs_indexes_load_together(packed: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each remote index costs a round trip: a batch's are fetched at once, not one after another."""
    ds = ShardedMapDataset(packed["tar"])
    together = threading.Barrier(3, timeout=10)  # passes only if three loads wait at once
    real = DatasetSource.index
    monkeypatch.setattr(DatasetSource, "index", lambda *a, **k: (together.wait(), real(*a, **k))[1])
    ds._readers.load_indexes([4, 0, 2, 0], threads=16)
    monkeypatch.setattr(DatasetSource, "index", real)
    assert sorted(ds._readers._indexes) == [0, 2, 4]
    assert ds._readers.index(2) is ds._readers._indexes[2]  # kept: not loaded again


def test_remote_lmdb_reads_through_the_cache(
    packed: dict[str, Path], s3: S3Server, s3_root: str, tmp_path: Path
) -> None:
    options = s3.storage_options()
    upload(packed["lmdb"], s3_root, options)
    remote = ShardedMapDataset(
        s3_root, remote=RemoteOptions(storage_options=options, cache_dir=tmp_path / "cache")
    )
    assert remote.__getitems__([5, 20]) == ShardedMapDataset(packed["lmdb"]).__getitems__([5, 20])


def test_get_command_lists_and_writes_a_sample(tmp_path: Path) -> None:
    src = tmp_path / "src"
    expected = make_tree(src, 12)
    out = pack_dataset(tmp_path, "tar", 12, max_samples=5)
    runner = CliRunner()
    listed = runner.invoke(main, ["get", str(out), "cls1/00004"])
    assert listed.exit_code == 0, listed.output
    assert "cls1/00004" in listed.output and "bin" in listed.output and "txt" in listed.output
    written = runner.invoke(main, ["get", str(out), "cls1/00004", "--out", str(tmp_path / "x")])
    assert written.exit_code == 0, written.output
    for field, data in expected["cls1/00004"].items():
        assert (tmp_path / "x" / f"cls1/00004.{field}").read_bytes() == data
    by_position = runner.invoke(main, ["get", str(out), "-1"])  # a negative position, no `--` needed
    assert by_position.exit_code == 0 and "sample 11 of split 'train'" in by_position.output
    assert "cls                         1 bytes  '1'" in listed.output  # short values are shown
    for args, code, message in (
        (["cls9/00000"], 2, "no sample with key 'cls9/00000'"),
        (["12"], 2, "sample 12 is out of range"),
        (["0", "--split", "val"], 1, "split 'val' is not in this dataset"),
    ):
        failed = runner.invoke(main, ["get", str(out), *args])
        assert failed.exit_code == code and message in failed.output, failed.output
        assert "Traceback" not in failed.output
    shutil.rmtree(tmp_path / "x")


def test_a_shard_the_node_cache_holds_is_read_there(
    packed: dict[str, Path], s3: S3Server, s3_root: str, tmp_path: Path
) -> None:
    options = RemoteOptions(storage_options=s3.storage_options(), cache_dir=tmp_path / "cache")
    upload(packed["tfrecord"], s3_root, options.storage_options)
    assert len(list(ShardedDataset(s3_root, remote=options))) == 80  # every shard now in the node cache
    s3.control.reset_counts()
    remote = ShardedMapDataset(s3_root, remote=options)
    wanted = [3, 40, 79]
    assert remote.__getitems__(wanted) == ShardedMapDataset(packed["tfrecord"]).__getitems__(wanted)
    assert all(path.endswith("/manifest.json") for _, path in s3.control.counts)  # no shard, no index


@pytest.mark.parametrize("size", [100, 20_000])  # read one by one; landed as a window's large samples
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_byte_flipped_in_a_sample_fails_its_checksum_in_every_kind_of_get(
    tmp_path: Path, fmt: str, size: int
) -> None:
    """One byte flipped in sample 3 of shard 1, which only its checksum can notice: a get, a batch of
    gets and a read of several each name the shard and the sample; the samples beside it still read."""
    out = pack_dataset(tmp_path / "packed", fmt, 20, max_samples=10, size=size)
    clean = shutil.copytree(out, tmp_path / "clean")
    manifest = load_manifest(out)
    entry, index = manifest.splits["train"][1], None
    if entry.index_path is not None:
        index = ShardIndex.read(out / str(entry.index_path), entry.num_samples, manifest.fields)
    damage_sample(get_format(fmt), out / entry.path, cast(ShardIndex, index), 3)
    dataset = ShardedMapDataset(out)
    wrong = r"shard-000001\.\w+, sample 3\b.*differ from their checksum"
    for read in (lambda: dataset[13], lambda: dataset.__getitems__([12, 13]), lambda: dataset.read([13, 2])):
        with pytest.raises(CorruptShardError, match=wrong):
            read()
    assert dataset.__getitems__([12, 14]) == ShardedMapDataset(clean).__getitems__([12, 14])
