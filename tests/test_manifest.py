"""The manifest: round trip, version 2's fields and digest, version 1 still read, and every malformed
manifest a DataError naming the file."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from shardpipe.errors import DataError
from shardpipe.formats.compression import FieldCodec
from shardpipe.manifest import (
    DIGEST_KEY,
    PLAIN_VERSION,
    Manifest,
    content_digest,
    load_manifest,
    write_manifest,
)
from shardpipe.shardtable import ShardEntry
from shardpipe.storage import open_store

SHA = "ab" * 32


def small_manifest(fmt: str = "tar") -> Manifest:
    index = fmt != "lmdb"
    shards = tuple(
        ShardEntry(
            f"train/shard-{i:06d}.{fmt}", 3 + i, 1000 + i, SHA, *((f"train/{i}.idx", SHA) if index else ())
        )
        for i in range(2)
    )
    return Manifest(format=fmt, fields=("bin", "cls"), splits={"train": shards}, split_rule={"method": "m"})


def write_json(tmp_path: Path, data: dict[str, Any], *, redigest: bool = True) -> Path:
    if redigest and data.get("manifest_version") in (2, 3):
        data[DIGEST_KEY] = content_digest(data)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_round_trip_writes_version_2(tmp_path: Path, fmt: str) -> None:
    manifest = small_manifest(fmt)
    write_manifest(open_store(tmp_path), manifest)
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert data["manifest_version"] == PLAIN_VERSION == 2 and "requires" not in data  # no feature needed
    assert (data["index_version"], data["sample_checksum"]) == (2, "xxh3_64")
    assert data[DIGEST_KEY] == content_digest(data)
    assert load_manifest(tmp_path) == manifest
    assert load_manifest(tmp_path / "manifest.json").dumps() == manifest.dumps()


def test_a_changed_field_name_is_caught_by_the_digest(tmp_path: Path) -> None:
    write_manifest(open_store(tmp_path), small_manifest())
    text = (tmp_path / "manifest.json").read_text()
    (tmp_path / "manifest.json").write_text(text.replace('"cls"', '"cms"'))
    with pytest.raises(DataError, match=rf"manifest {tmp_path}/manifest.json .*{DIGEST_KEY}"):
        load_manifest(tmp_path)


def test_version_1_reads_without_checks_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = small_manifest().to_json()
    for key in ("index_version", "sample_checksum", DIGEST_KEY):
        del data[key]
    data["manifest_version"] = 1
    write_json(tmp_path, data)
    with caplog.at_level(logging.WARNING, logger="shardpipe"):
        first, second = load_manifest(tmp_path), load_manifest(tmp_path)
    assert first == second
    assert (first.manifest_version, first.index_version, first.sample_checksum) == (1, 1, None)
    assert [r.getMessage() for r in caplog.records if "without per-sample checksums" in r.getMessage()] == [
        f"manifest {tmp_path}/manifest.json is version 1: samples are read without per-sample checksums; "
        "repack (or rerun `shardpipe index --overwrite` on adopted shards) to add them"
    ]


def _edit(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(data))
    node = out
    for step in path[:-1]:
        node = node[step]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("manifest_version",), 4, "version 4 is not supported"),
        (("manifest_version",), "2", "version '2' is not supported"),
        (("format",), "zip", "format 'zip'"),
        (("format",), _DELETE, "missing entry 'format'"),
        (("fields",), "bin", "fields is str"),
        (("fields",), ["bin", "bin"], "distinct"),
        (("splits", "train", "samples"), 8, "says 8 samples, its shards add up to 7"),
        (("splits", "train", "bytes"), 1, "says 1 bytes"),
        (("splits", "train", "shards", 0, "samples"), "3", "expected a count"),
        (("splits", "train", "shards", 0, "bytes"), -1, "expected a count"),
        (("splits", "train", "shards", 0, "path"), "/etc/passwd", "relative"),
        (("splits", "train", "shards", 0, "path"), "../x.tar", "relative"),
        (("splits", "train", "shards", 0, "index"), None, "has no index"),
        (("splits", "train", "shards", 0, "index", "path"), "/dev/zero", "index: the path '/dev/zero'"),
        (("splits", "train", "shards", 0, "index", "path"), "../../../../etc/passwd", "relative inside"),
        (("splits", "train", "shards", 0, "index"), "x", "index is str"),
        (("splits", "train", "shards"), {}, "shards is dict"),
        (("splits",), [], "splits is list"),
        (("index_version",), 7, "index_version 7"),
        (("sample_checksum",), "md5", "sample_checksum 'md5'"),
        (("classes",), [1, 2], "classes must be names"),
    ],
)
def test_malformed_manifests_are_data_errors_naming_the_file(
    tmp_path: Path, path: tuple[Any, ...], value: Any, message: str
) -> None:
    write_json(tmp_path, _edit(small_manifest().to_json(), path, value))
    with pytest.raises(DataError, match=message) as info:
        load_manifest(tmp_path)
    assert str(tmp_path / "manifest.json") in str(info.value)


@pytest.mark.parametrize("text", ["", "{", "[]", "null", '"x"', "\xff\xfe", '{"manifest_version": 2}'])
def test_unparsable_manifests_are_data_errors(tmp_path: Path, text: str) -> None:
    (tmp_path / "manifest.json").write_text(text, errors="surrogateescape")
    with pytest.raises(DataError, match="manifest"):
        load_manifest(tmp_path)


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from _leaves(child, (*path, key))


def test_any_value_of_any_type_anywhere_is_read_or_a_data_error(tmp_path: Path) -> None:
    data = small_manifest().to_json()
    outcomes = set()
    for path in list(_leaves(data))[1:]:
        for value in (None, "x", -1, 0, 1.5, True, [], {}, [1], {"a": 1}, _DELETE):
            write_json(tmp_path, _edit(data, path, value))
            try:
                load_manifest(tmp_path)
                outcomes.add("read")
            except DataError:
                outcomes.add("error")
    assert outcomes == {"read", "error"}  # metadata such as split_rule may hold anything


def test_missing_manifest_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="shardpipe pack"):
        load_manifest(tmp_path)


@pytest.mark.parametrize("fmt", ["lmdb", "tar", "tfrecord"])
def test_a_version_1_dataset_still_reads(tmp_path: Path, fmt: str) -> None:
    from loaders import ShardedDataset
    from tests.datagen import pack_dataset
    from tests.v1data import downgrade_to_v1

    root = pack_dataset(tmp_path, fmt, 12, max_samples=5)
    before = list(ShardedDataset(root, "train", shuffle=False))
    downgrade_to_v1(root)
    assert load_manifest(root).manifest_version == 1
    assert list(ShardedDataset(root, "train", shuffle=False)) == before


def compressed_manifest() -> Manifest:
    codec = FieldCodec("zstd", 3, 1 << 20, "compression/bin.zdict", SHA)
    return replace(small_manifest(), compression={"bin": codec})


def test_a_pack_says_which_features_a_reader_needs(tmp_path: Path) -> None:
    """Compression needs version 3 and says so, so a release that reads only version 2 refuses the pack
    instead of returning zstd frames as data; a feature this shardpipe does not know is refused by name."""
    write_manifest(open_store(tmp_path), compressed_manifest())
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert (data["manifest_version"], data["requires"]) == (3, ["compression"])
    assert load_manifest(tmp_path) == compressed_manifest()
    write_json(tmp_path, {**data, "requires": ["compression", "tokens"]})
    with pytest.raises(DataError, match="requires 'tokens', which this shardpipe cannot read"):
        load_manifest(tmp_path)
    without = {key: value for key, value in data.items() if key != "compression"}
    write_json(tmp_path, without)  # compression removed by hand, the digest recomputed
    with pytest.raises(DataError, match="disagrees with the compression it records"):
        load_manifest(tmp_path)


@pytest.mark.parametrize("path", ["/dev/zero", "../../etc/passwd", "compression/../../x"])
def test_a_dictionary_path_outside_the_dataset_is_refused(tmp_path: Path, path: str) -> None:
    data = compressed_manifest().to_json()
    data["compression"]["bin"]["dictionary"]["path"] = path
    write_json(tmp_path, data)
    with pytest.raises(DataError, match=r"the dictionary of field 'bin': the path .* relative inside"):
        load_manifest(tmp_path)
