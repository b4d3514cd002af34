"""Shard tables: a split of more than ``LISTED_SHARDS`` shards keeps them in an Arrow file that the manifest
names and checks; the loaders, ``verify`` and ``inspect`` read it as they read a listed split."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

import shardpipe.shardtable
from loaders import RemoteOptions, ShardedDataset
from shardpipe.errors import DataError
from shardpipe.manifest import DIGEST_KEY, content_digest, load_manifest
from shardpipe.shardtable import SCHEMA, ShardEntry, ShardTable
from shardpipe.tools.inspection import inspect
from shardpipe.tools.verify import verify
from tests.datagen import pack_dataset

TABLE = "train.shards.arrow"


@pytest.fixture
def tabled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """12 samples in 12 shards, more than the 4 a split may list here."""
    monkeypatch.setattr(shardpipe.shardtable, "LISTED_SHARDS", 4)
    return pack_dataset(tmp_path / "tabled", "tar", 12, max_samples=1)


def test_a_large_split_keeps_its_shards_in_a_checked_table_file(tabled: Path) -> None:
    data = json.loads((tabled / "manifest.json").read_text())
    assert data["manifest_version"] == 3 and data["requires"] == ["shard_table"]
    assert data["splits"]["train"]["table"]["path"] == TABLE and "shards" not in data["splits"]["train"]
    shards = load_manifest(tabled).split_shards("train")
    assert shards.encode() == (tabled / TABLE).read_bytes()  # the same rows give the same bytes
    assert len(shards) == 12 and [entry.path for entry in shards] == list(shards.paths)

    keys = {f"cls{i % 3}/{i:05d}" for i in range(12)}
    assert sorted(sample["__key__"] for sample in ShardedDataset(tabled, seed=3)) == sorted(keys)
    assert verify(tabled, quiet=True) == []
    summary = inspect(tabled)["splits"]["train"]
    assert (summary["shards"], summary["samples"], summary["shard_samples"]["max"]) == (12, 12, 1)


def test_a_damaged_missing_or_unlisted_table_is_an_error_naming_it(tabled: Path) -> None:
    table = (tabled / TABLE).read_bytes()
    (tabled / TABLE).write_bytes(table[:100] + bytes([table[100] ^ 1]) + table[101:])
    with pytest.raises(DataError, match=f"shard table .*{TABLE}: its sha256 differs"):
        load_manifest(tabled)
    (tabled / TABLE).unlink()
    with pytest.raises(DataError, match=f"cannot read the shard table .*{TABLE}"):
        load_manifest(tabled)
    data = json.loads((tabled / "manifest.json").read_text())
    data["requires"] = []  # a release that does not know shard tables must refuse the pack, not misread it
    data[DIGEST_KEY] = content_digest(data)
    (tabled / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match="disagrees with the shard_table"):
        load_manifest(tabled)


def test_a_remote_table_is_read_through_the_store(
    tabled: Path, http_dir: tuple[Path, str], tmp_path: Path
) -> None:
    folder, url = http_dir
    shutil.copytree(tabled, folder, dirs_exist_ok=True)
    assert load_manifest(url).splits == load_manifest(tabled).splits
    assert len(list(ShardedDataset(url, remote=RemoteOptions(cache_dir=tmp_path / "cache")))) == 12


def test_a_table_holds_rows_and_columns_without_objects_per_shard(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = [
        ShardEntry(f"s/{i}.tar", i, 10 * i, "ab" * 32, f"s/{i}.idx", "cd" * 32, compressed={"img": (9, i)})
        for i in range(5)
    ]
    shards = ShardTable.of(entries)
    assert list(shards) == entries and shards[-1] == entries[-1] and list(shards[1:3]) == entries[1:3]
    monkeypatch.setattr(shardpipe.shardtable, "KEPT_ROWS", 2)  # entries built again once dropped
    assert [shards[i] for i in (0, 1, 2, 0, 4, 3)] == [entries[i] for i in (0, 1, 2, 0, 4, 3)]
    assert shards.num_samples.tolist() == [0, 1, 2, 3, 4] and shards.paths[2] == "s/2.tar"
    assert shards.compressed_bytes("img") == (45, 10) and shards.compressed_bytes("txt") is None
    assert ShardTable.decode(pa.py_buffer(shards.encode())) == shards
    assert shards.first_without_index() is None
    assert ShardTable.of([*entries, ShardEntry("s/x.tar", 1, 1, "ab")]).first_without_index() == "s/x.tar"

    negative = pa.Table.from_pylist([{**_row(entries[1]), "samples": -1}], schema=SCHEMA)
    with pytest.raises(ValueError, match="samples is negative"):
        ShardTable.decode(pa.py_buffer(ShardTable(negative).encode()))
    with pytest.raises(ValueError, match="columns are"):
        ShardTable(pa.table({"path": ["a"]}))
    outside = ShardTable(pa.Table.from_pylist([{**_row(entries[1]), "path": "../x.tar"}], schema=SCHEMA))
    with pytest.raises(ValueError, match="must be relative inside the dataset"):
        outside[0]  # a row is checked when it is read, as a listed entry is when the manifest loads


def _row(entry: ShardEntry) -> dict[str, object]:
    return {
        "path": entry.path,
        "samples": entry.num_samples,
        "bytes": entry.num_bytes,
        "sha256": entry.sha256,
        "index_path": entry.index_path,
        "index_sha256": entry.index_sha256,
        "keys_xxh3": None,
        "compressed": [],
    }
