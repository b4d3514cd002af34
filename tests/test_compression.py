"""``--compress zstd``: every format round trip on both read paths, local and S3; the same bytes for any
worker count; verify without decompressing; damaged frames and dictionaries; usage errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import zstandard
from click.testing import CliRunner

from loaders import RemoteOptions, ShardedDataset, ShardedMapDataset, make_loader
from loaders.reading.compression import field_codecs
from shardpipe.cli import main
from shardpipe.errors import CorruptShardError, DataError, UsageError
from shardpipe.formats.compression import CompressSpec, FieldCodec, chosen_fields, parse_compress
from shardpipe.formats.decompressor import CompressedFieldError, FieldCodecs
from shardpipe.manifest import load_manifest
from shardpipe.packing import PackOptions, pack
from shardpipe.packing.dataset_writer import DatasetWriter
from shardpipe.packing.items import pack_items
from shardpipe.storage import open_store
from shardpipe.tools.verify import verify
from testkit.servers import S3Server

FORMATS = ("tar", "lmdb", "tfrecord")


def record(i: int) -> bytes:
    """A JSON record of a few hundred bytes, alike in shape as real metadata is."""
    words = " ".join(f"word{(i * 7 + k) % 50}" for k in range(30))
    return json.dumps({"id": i, "label": f"class{i % 5}", "caption": words, "score": i / 3}).encode()


def make_source(root: Path, count: int = 60) -> dict[str, dict[str, bytes]]:
    expected = {}
    for i in range(count):
        key = f"s/{i:04d}"
        fields = {"json": record(i), "txt": f"caption {i} of a sample".encode(), "jpg": bytes([i % 256]) * 50}
        (root / "s").mkdir(parents=True, exist_ok=True)
        for name, data in fields.items():
            (root / f"{key}.{name}").write_bytes(data)
        expected[key] = fields
    return expected


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, bytes]]]:
    root = tmp_path_factory.mktemp("zsrc")
    return root, make_source(root)


def packed(src: Path, out: Path, fmt: str, **options: Any) -> Path:
    pack(
        src, out, PackOptions(format=fmt, max_samples=16, compress="zstd:5", workers=1, **options), quiet=True
    )
    return out


def read_samples(dataset: ShardedDataset) -> dict[str, dict[str, bytes]]:
    return {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")} for s in dataset}


def read_batches(dataset: ShardedDataset) -> dict[str, dict[str, bytes]]:
    found: dict[str, dict[str, bytes]] = {}
    for batch in make_loader(dataset, batch_size=8, num_workers=0):
        names = [n for n in batch if not n.startswith("__")]
        for i, key in enumerate(batch["__key__"]):
            found[key] = {name: batch[name][i] for name in names}
    return found


def test_parse_and_choose() -> None:
    assert parse_compress("zstd") == CompressSpec("zstd", 3)
    assert parse_compress("zstd:19") == CompressSpec("zstd", 19)
    assert parse_compress(None) is None and parse_compress("none") is None
    for bad in ("lz4", "zstd:0", "zstd:23", "zstd:x", "zstd:-1", "gzip:3"):
        with pytest.raises(UsageError):
            parse_compress(bad)
    assert chosen_fields(("jpg", "json", "thumb.png", "txt", "npy"), None) == ("json", "txt", "npy")
    assert chosen_fields(("jpg", "json", "txt"), ("jpg",)) == ("jpg",)
    with pytest.raises(UsageError, match="not fields"):
        chosen_fields(("json",), ("txt",))


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_round_trips_on_both_paths(
    fmt: str, source: tuple[Path, dict[str, dict[str, bytes]]], tmp_path: Path
) -> None:
    src, expected = source
    out = packed(src, tmp_path / fmt, fmt)
    manifest = load_manifest(out)
    assert set(manifest.compression) == {"json", "txt"}  # jpg is compressed already
    assert manifest.compression["json"].dictionary == "compression/json.zdict"
    assert (out / "compression" / "json.zdict").is_file()
    plain = tmp_path / "plain"
    pack(src, plain, PackOptions(format=fmt, max_samples=16, workers=1), quiet=True)
    stored, before = (sum(s.num_bytes for s in m.splits["train"]) for m in (manifest, load_manifest(plain)))
    assert stored < before or (fmt == "tar" and stored == before)  # a tar member takes 512-byte blocks
    assert read_samples(ShardedDataset(out, shuffle=False)) == expected
    assert read_batches(ShardedDataset(out, shuffle=False)) == expected
    assert verify(out, quiet=True) == []


def test_the_same_bytes_for_any_worker_count(
    source: tuple[Path, dict[str, dict[str, bytes]]], tmp_path: Path
) -> None:
    src, _ = source
    one = packed(src, tmp_path / "one", "tar")
    pack(
        src,
        tmp_path / "three",
        PackOptions(format="tar", max_samples=16, compress="zstd:5", workers=3),
        quiet=True,
    )
    assert files(one) == files(tmp_path / "three")


def test_a_mapped_pack_and_its_field_list(
    source: tuple[Path, dict[str, dict[str, bytes]]], tmp_path: Path
) -> None:
    """Mapped outputs are compressed as they are rewritten from the staged pieces; the field list picks."""
    src, expected = source
    options = dict(map="tests.maps:twice", compress_fields=("json",))
    one = packed(src, tmp_path / "one", "tfrecord", **options)
    pack(
        src,
        tmp_path / "two",
        PackOptions(format="tfrecord", max_samples=16, compress="zstd:5", workers=2, **options),  # type: ignore[arg-type]
        quiet=True,
    )
    assert files(one) == files(tmp_path / "two")
    assert set(load_manifest(one).compression) == {"json"}
    found = read_samples(ShardedDataset(one, shuffle=False))
    assert found[f"{next(iter(expected))}_a"] == next(iter(expected.values()))
    assert len(found) == 2 * len(expected)


def make_item(i: int) -> dict[str, Any]:
    return {"__key__": f"item{i:04d}", "json": record(i), "npy": bytes(range(256)) * 2}


def test_pack_items_and_the_writer(tmp_path: Path) -> None:
    options = PackOptions(format="lmdb", compress="zstd", workers=1)
    pack_items(range(40), "tests.test_compression:make_item", tmp_path / "items", options, quiet=True)
    expected = {f"item{i:04d}": {"json": record(i), "npy": bytes(range(256)) * 2} for i in range(40)}
    assert read_samples(ShardedDataset(tmp_path / "items", shuffle=False)) == expected
    assert set(load_manifest(tmp_path / "items").compression) == {"json", "npy"}
    with DatasetWriter(tmp_path / "writer", "tar", max_samples=8, compress="zstd:3") as writer:
        for i in range(40):
            writer.write(make_item(i))
    assert read_batches(ShardedDataset(tmp_path / "writer", shuffle=False)) == expected
    assert verify(tmp_path / "writer", quiet=True) == []


@pytest.mark.parametrize("cache", [True, False])
def test_read_from_s3(
    cache: bool, source: tuple[Path, dict[str, dict[str, bytes]]], tmp_path: Path, s3: S3Server, s3_root: str
) -> None:
    src, expected = source
    out = packed(src, tmp_path / "local", "tar")
    options = s3.storage_options()
    store = open_store(s3_root, storage_options=options)
    for name, data in files(out).items():
        store.put(name, data)
    remote = RemoteOptions(storage_options=options, cache=cache, cache_dir=tmp_path / "cache")
    assert read_samples(ShardedDataset(s3_root, shuffle=False, remote=remote)) == expected
    assert read_batches(ShardedDataset(s3_root, shuffle=False, remote=remote)) == expected


def test_pack_to_s3(
    source: tuple[Path, dict[str, dict[str, bytes]]], tmp_path: Path, s3: S3Server, s3_root: str
) -> None:
    """Dictionaries go to the bucket beside the manifest; the bucket holds the local pack's bytes."""
    src, expected = source
    local = packed(src, tmp_path / "local", "tfrecord")
    options = s3.storage_options()
    opts = PackOptions(format="tfrecord", max_samples=16, compress="zstd:5", workers=2)
    pack(src, s3_root, opts, quiet=True, storage_options=options)
    store = open_store(s3_root, storage_options=options)
    assert {key: store.read(key) for key in store.list_keys()} == files(local)
    remote = RemoteOptions(storage_options=options, cache_dir=tmp_path / "cache")
    assert read_batches(ShardedDataset(s3_root, shuffle=False, remote=remote)) == expected
    assert verify(s3_root, quiet=True, storage_options=options) == []


def damage_first_frame(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    at = data.find(b"\x28\xb5\x2f\xfd")  # zstd's frame magic
    data[at : at + 4] = b"XXXX"
    shard.write_bytes(bytes(data))


def test_a_damaged_frame_is_a_project_error_or_skipped(
    source: tuple[Path, dict[str, dict[str, bytes]]], tmp_path: Path
) -> None:
    src, expected = source
    out = packed(src, tmp_path / "out", "tar", order="sorted")
    damage_first_frame(out / "train" / "shard-000000.tar")
    with pytest.raises(CorruptShardError):  # the checksum of the stored bytes finds it first
        read_samples(ShardedDataset(out, shuffle=False))
    with pytest.raises(
        CompressedFieldError, match=r"shard-000000\.tar, sample 0: field 'json' of sample 's/0000'"
    ):
        read_samples(ShardedDataset(out, shuffle=False, check=False))
    dataset = ShardedDataset(out, shuffle=False, check=False, on_error="skip")
    found = {s["__key__"] for s in dataset if not s["__pad__"]}
    assert found == set(expected) - {"s/0000"} and dataset.num_errors == 1
    assert any("shard-000000.tar" in line for line in verify(out, quiet=True))


def test_a_damaged_dictionary(source: tuple[Path, dict[str, dict[str, bytes]]], tmp_path: Path) -> None:
    src, _ = source
    out = packed(src, tmp_path / "out", "lmdb")
    path = out / "compression" / "txt.zdict"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DataError, match=r"txt\.zdict.*'txt'"):
        read_samples(ShardedDataset(out, shuffle=False))
    assert any("txt.zdict" in line for line in verify(out, quiet=True))


def codecs(max_bytes: int = 1 << 20) -> FieldCodecs:
    found = FieldCodecs.load({"json": FieldCodec("zstd", 3, max_bytes)}, lambda path: b"")
    assert found is not None
    return found


def test_frames_are_bounded_and_named() -> None:
    frames = [zstandard.ZstdCompressor().compress(record(i)) for i in range(3)]
    keys = ["a", "b", "c"]
    assert codecs().decode_columns(keys, {"json": frames, "jpg": [b"x"] * 3}, "s.tar")[
        "json"
    ].to_pylist() == [record(i) for i in range(3)]
    with pytest.raises(CompressedFieldError, match="more than the bound"):
        codecs(max_bytes=10).decode_columns(keys, {"json": frames}, "s.tar")
    with pytest.raises(CompressedFieldError, match=r"s\.tar, sample 12: field 'json' of sample 'b'"):
        codecs().decode_columns(keys, {"json": [frames[0], frames[1][:-4], frames[2]]}, "s.tar", [11, 12, 13])
    with pytest.raises(CompressedFieldError, match=r"sample 'c'"):  # a value holding two frames
        codecs().decode_columns(keys, {"json": [frames[0], frames[1], frames[2] + frames[0]]}, "s.tar")
    assert codecs().decode_columns(["a", "b"], {"json": [frames[0], None]}, "s.tar")["json"] == [
        record(0),
        None,
    ]
    unsized = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    with pytest.raises(CompressedFieldError, match="content size"):
        codecs().decode_columns(["a"], {"json": [unsized.compress(b"x" * 100) + unsized.flush()]}, "s.tar")
    assert FieldCodecs.load({}, lambda path: b"") is None


def test_field_codecs_of_a_source(source: tuple[Path, dict[str, dict[str, bytes]]], tmp_path: Path) -> None:
    """The one function a random-access reader calls: decoders of a dataset, applied to read_runs' columns."""
    src, expected = source
    out = packed(src, tmp_path / "out", "tfrecord", order="sorted")
    dataset = ShardedDataset(out, shuffle=False)
    found = field_codecs(dataset.source)
    assert found is not None and set(found.names) == {"json", "txt"}
    with dataset._readers.reading(0) as reader:
        keys, columns = reader.read_runs([(2, 5)], dataset.manifest.fields)
    decoded = found.decode_columns(keys, columns, dataset.shards[0].path, [2, 3, 4])
    assert [bytes(v) for v in decoded["json"].to_pylist()] == [expected[key]["json"] for key in keys]


def test_cli_usage_errors_and_a_pack(
    source: tuple[Path, dict[str, dict[str, bytes]]], tmp_path: Path
) -> None:
    src, _ = source
    runner = CliRunner()
    for args, message in (
        (["--compress", "brotli"], "codec 'brotli' is not supported"),
        (["--compress", "zstd:40"], "level '40'"),
        (["--compress-fields", "json"], "give compress too"),
    ):
        result = runner.invoke(main, ["pack", str(src), str(tmp_path / "x"), "--format", "tar", *args])
        assert result.exit_code == 2 and message in result.output
    result = runner.invoke(
        main, ["pack", str(src), str(tmp_path / "ok"), "--format", "tar", "--compress", "zstd:7", "-q"]
    )
    assert result.exit_code == 0, result.output
    assert load_manifest(tmp_path / "ok").compression["json"].level == 7
    shown = runner.invoke(main, ["inspect", str(tmp_path / "ok")])
    assert shown.exit_code == 0 and "compressed: json (zstd:7, dictionary, " in shown.output


def test_decoders_serve_threads() -> None:
    """A random-access batch reads its remote shards in threads: each thread gets its own zstd context."""
    from concurrent.futures import ThreadPoolExecutor

    frames = [zstandard.ZstdCompressor().compress(record(i)) for i in range(200)]
    shared, keys = codecs(), [str(i) for i in range(200)]
    with ThreadPoolExecutor(4) as pool:
        found = list(
            pool.map(lambda _: shared.decode_columns(keys, {"json": frames}, "s")["json"], range(16))
        )
    assert all(column.to_pylist() == [record(i) for i in range(200)] for column in found)


@pytest.mark.parametrize("fmt", ["tfrecord", "lmdb"])
def test_random_access_decompresses_locally_and_from_s3(
    fmt: str, source: tuple[Path, dict[str, dict[str, bytes]]], tmp_path: Path, s3: S3Server, s3_root: str
) -> None:
    src, expected = source
    out = packed(src, tmp_path / fmt, fmt)
    options = s3.storage_options()
    store = open_store(s3_root, storage_options=options)
    for name, data in files(out).items():
        store.put(name, data)
    remote = RemoteOptions(storage_options=options, cache_dir=tmp_path / "cache")
    wanted = list(range(59, -1, -3))  # 20 positions over every shard
    for ds in (ShardedMapDataset(out), ShardedMapDataset(s3_root, remote=remote)):
        got = ds.__getitems__(wanted)
        assert {s["__key__"]: {k: s[k] for k in ("json", "txt", "jpg")} for s in got} == {
            s["__key__"]: expected[s["__key__"]] for s in got
        }
        assert ds.get("s/0007")["json"] == expected["s/0007"]["json"]
        assert ds.get_batch([ds.position_of("s/0007")])["json"][0] == expected["s/0007"]["json"]
