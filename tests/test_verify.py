"""``shardpipe verify``: a sound dataset has no problems; each kind of damage is named with its file and
sample, per-sample checksums included; version-1 datasets verify without them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardpipe.errors import DataError
from shardpipe.formats import get_format
from shardpipe.formats.layout import ShardIndex
from shardpipe.manifest import load_manifest
from shardpipe.tools.verify import verify
from tests.datagen import pack_dataset
from tests.v1data import downgrade_to_v1

FORMATS = ["lmdb", "tar", "tfrecord"]


@pytest.fixture(params=FORMATS)
def dataset(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return pack_dataset(tmp_path, request.param, 12, max_samples=5)


def _flip(path: Path, value: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[raw.index(value) + 3] ^= 0x10
    path.write_bytes(bytes(raw))


def test_a_sound_dataset_has_no_problems(dataset: Path) -> None:
    assert verify(dataset, quiet=True) == []
    assert verify(dataset / "manifest.json", quiet=True) == []


def test_a_flipped_sample_byte_is_named(dataset: Path) -> None:
    manifest = load_manifest(dataset)
    shard = manifest.splits["train"][1]
    (_, first), *_ = get_format(manifest.format).read(
        dataset / shard.path,
        0,
        1,
        None
        if shard.index_path is None
        else ShardIndex.read(dataset / shard.index_path, shard.num_samples, manifest.fields),
    )
    _flip(dataset / shard.path, first["bin"])
    problems = verify(dataset, quiet=True)
    assert f"{shard.path}: sha256 differs from the manifest (content changed or corrupt)" in problems
    if manifest.format == "lmdb":  # each record's checksum
        assert any("sample 0" in p and "checksum" in p for p in problems), problems
    elif manifest.format == "tfrecord":  # the record's own CRC fails first, in the full parse
        assert any("sample 0" in p and "data CRC mismatch" in p for p in problems), problems
    else:  # tar: the parse reads only headers; the sample checksum in the index catches the data
        assert f"{shard.index_path}: sample 0's bytes differ from its checksum" in problems


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])  # LMDB shards have no index file
def test_a_damaged_index_is_named(tmp_path: Path, fmt: str) -> None:
    dataset = pack_dataset(tmp_path, fmt, 12, max_samples=5)
    shard = load_manifest(dataset).splits["train"][0]
    assert shard.index_path is not None
    path = dataset / shard.index_path
    raw = bytearray(path.read_bytes())
    raw[8 * 2] ^= 1  # sample 0's key start
    path.write_bytes(bytes(raw))
    problems = verify(dataset, quiet=True)
    assert f"{shard.index_path}: sha256 differs from the manifest" in problems
    assert any(shard.index_path in p and "sample 0" in p for p in problems[1:]), problems


def test_missing_and_truncated_shards_are_named(dataset: Path) -> None:
    shards = load_manifest(dataset).splits["train"]
    (dataset / shards[0].path).unlink()
    path = dataset / shards[1].path
    path.write_bytes(path.read_bytes()[:-700])
    problems = verify(dataset, quiet=True)
    assert problems[0] == f"{shards[0].path}: missing"
    assert any(p.startswith(f"{shards[1].path}: ") and "bytes, manifest says" in p for p in problems)


def test_a_damaged_manifest_is_a_data_error(dataset: Path) -> None:
    text = (dataset / "manifest.json").read_text()
    (dataset / "manifest.json").write_text(text.replace('"samples": 5', '"samples": 6', 1))
    with pytest.raises(DataError, match="manifest"):
        verify(dataset, quiet=True)


def test_version_1_datasets_verify_without_sample_checksums(dataset: Path) -> None:
    downgrade_to_v1(dataset)
    assert load_manifest(dataset).manifest_version == 1
    assert verify(dataset, quiet=True) == []
    data = json.loads((dataset / "manifest.json").read_text())
    assert "sample_checksum" not in data
