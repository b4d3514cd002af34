"""``shardpipe index`` (shardpipe.tools.index): foreign shards adopted without repacking, with sample
checksums computed from their bytes at index time, so damage found later is an error like in packed shards."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardpipe.errors import CorruptShardError, DataError, UsageError
from shardpipe.formats import get_format
from shardpipe.formats.layout import ShardIndex
from shardpipe.manifest import Manifest, load_manifest
from shardpipe.tools.index import index
from shardpipe.tools.verify import verify


def _tars(folder: Path) -> None:
    import webdataset as wds

    (folder / "val").mkdir(parents=True)
    for name in ["a.tar", "b.tar", "val/c.tar"]:
        with wds.TarWriter(str(folder / name)) as sink:
            for i in range(4):
                key = f"{Path(name).stem}{i}" if i != 3 else "p" * 120  # a PAX name: the parser's path
                sink.write({"__key__": key, "txt": f"t{i}".encode() * 50, "cls": str(i).encode()})


def _tfrecords(folder: Path) -> None:
    from tfrecord.writer import TFRecordWriter

    folder.mkdir(parents=True)
    writer = TFRecordWriter(str(folder / "x.tfrecord"))
    for i in range(3):
        writer.write({"png": (f"img{i}".encode() * 40, "byte"), "label": (i, "int")})
    writer.close()


def read_split(root: Path, manifest: Manifest, split: str) -> list[tuple[str, dict[str, bytes]]]:
    fmt, out = get_format(manifest.format), []
    for shard in manifest.splits[split]:
        assert shard.index_path is not None
        shard_index = ShardIndex.read(
            root / shard.index_path, shard.num_samples, manifest.fields, sha256=shard.index_sha256
        )
        with fmt.open_reader(root / shard.path, shard_index) as reader:
            out += list(reader.read(0, shard.num_samples))
    return out


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # webdataset's open files
def test_adopted_tars_get_checksums_and_read_checked(tmp_path: Path) -> None:
    folder = tmp_path / "wds"
    _tars(folder)
    manifest = index(folder, quiet=True)
    assert load_manifest(folder) == manifest and (manifest.index_version, manifest.sample_checksum) == (
        2,
        "xxh3_64",
    )
    assert sorted(manifest.splits) == ["train", "val"] and manifest.fields == ("cls", "txt")
    samples = read_split(folder, manifest, "train")
    assert [key for key, _ in samples] == ["a0", "a1", "a2", "p" * 120, "b0", "b1", "b2", "p" * 120]
    assert samples[1][1] == {"txt": b"t1" * 50, "cls": b"1"}
    assert verify(folder, quiet=True) == []

    shard = manifest.splits["val"][0]
    raw = bytearray((folder / shard.path).read_bytes())
    raw[raw.index(b"t2" * 50) + 7] ^= 1  # a data byte: no tar header checksum covers it
    (folder / shard.path).write_bytes(bytes(raw))
    with pytest.raises(CorruptShardError, match="checksum") as info:
        read_split(folder, manifest, "val")
    assert info.value.sample_index == 2 and info.value.shard.endswith("val/c.tar")
    assert any("sample 2's bytes differ from its checksum" in p for p in verify(folder, quiet=True))


def test_adopted_tfrecords_read_checked(tmp_path: Path) -> None:
    folder = tmp_path / "tfr"
    _tfrecords(folder)
    manifest = index(folder, quiet=True)
    samples = read_split(folder, manifest, "train")
    assert samples[1] == ("x/00000001", {"png": b"img1" * 40, "label": b"1"})
    raw = bytearray((folder / "x.tfrecord").read_bytes())
    raw[raw.index(b"img0" * 40) + 5] ^= 1
    (folder / "x.tfrecord").write_bytes(bytes(raw))
    with pytest.raises(CorruptShardError, match="checksum") as info:
        read_split(folder, manifest, "train")
    assert info.value.sample_index == 0


def test_index_refuses_what_it_cannot_adopt(tmp_path: Path) -> None:
    folder = tmp_path / "tfr"
    _tfrecords(folder)
    index(folder, quiet=True)
    with pytest.raises(UsageError, match="--overwrite"):
        index(folder, quiet=True)
    assert index(folder, overwrite=True, quiet=True) == load_manifest(folder)
    (folder / "y.tar").write_bytes(bytes(1024))
    with pytest.raises(DataError, match="mixes shard formats"):
        index(folder, overwrite=True, quiet=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no shards"):
        index(tmp_path / "empty", quiet=True)
    with pytest.raises(UsageError, match="not a directory"):
        index(folder / "x.tfrecord", quiet=True)
