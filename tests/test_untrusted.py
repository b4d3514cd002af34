"""Nothing a pack says about itself is trusted: keys are checked before a lookup relies on them, every path
the manifest names stays inside the dataset and is read only from a regular file and only so far, `verify`
decompresses what it can, and a file name that is not UTF-8 is refused naming it. Each case here was a
foreign exception, a hang, unbounded memory or a wrong answer before."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from loaders import ShardedDataset, ShardedMapDataset
from shardpipe.cli import main
from shardpipe.errors import CorruptShardError, DataError
from shardpipe.formats.layout import ShardIndex
from shardpipe.manifest import DIGEST_KEY, content_digest, load_manifest
from shardpipe.tools.verify import verify
from tests.datagen import pack_dataset


def flip_key_bit(out: Path, shard: int, sample: int, mask: int) -> str:
    """Flip bits of one sample's key in its shard; return the key it had."""
    manifest = load_manifest(out)
    entry = manifest.splits["train"][shard]
    index = ShardIndex.read(out / str(entry.index_path), entry.num_samples, manifest.fields)
    data = bytearray((out / entry.path).read_bytes())
    start, stop = int(index.key_starts[sample]), int(index.key_stops[sample])
    key = data[start:stop].decode()
    data[stop - 1] ^= mask
    (out / entry.path).write_bytes(bytes(data))
    return key


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_a_key_that_is_no_longer_utf8_is_a_corrupt_shard_for_every_lookup(tmp_path: Path, fmt: str) -> None:
    out = pack_dataset(tmp_path, fmt, 12, max_samples=6)
    flip_key_bit(out, 1, 2, 0x80)
    ds = ShardedMapDataset(out)
    with pytest.raises(CorruptShardError, match=rf"shard-000001\.{fmt}, sample 2: its key is not UTF-8"):
        ds.get("cls0/00000")  # any key: the table of keys is built once, from every shard


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_a_key_damaged_into_another_name_is_a_corrupt_shard_not_a_missing_key(
    tmp_path: Path, fmt: str
) -> None:
    out = pack_dataset(tmp_path, fmt, 12, max_samples=6)
    key = flip_key_bit(out, 0, 3, 0x01)
    result = CliRunner().invoke(main, ["get", str(out), key])
    assert result.exit_code == 1, result.output  # a data error, not "no sample with that key" (exit 2)
    assert "keys differ from the manifest's checksum" in result.output
    assert f"shard-000000.{fmt}" in result.output
    assert any(f"shard-000000.{fmt}" in problem for problem in verify(out, quiet=True))


def replace_with(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.timeout(60)  # a FIFO opened for reading blocks until someone writes: that was a hang
@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero"])
def test_an_index_or_dictionary_that_is_no_regular_file_is_refused_unread(tmp_path: Path, kind: str) -> None:
    out = pack_dataset(tmp_path, "tar", 12, max_samples=6)
    entry = load_manifest(out).splits["train"][0]
    replace_with(out / str(entry.index_path), kind)
    with pytest.raises(DataError, match="not a regular file"):
        list(ShardedDataset(out))
    assert any("not a regular file" in problem for problem in verify(out, quiet=True))

    compressed = tmp_path / "compressed"
    runner = CliRunner()
    packed = runner.invoke(main, ["pack", str(tmp_path / "src"), str(compressed), "--format", "tar",
                                  "--compress", "zstd", "--compress-fields", "txt", "-q"])  # fmt: skip
    assert packed.exit_code == 0, packed.output
    replace_with(compressed / "compression" / "txt.zdict", kind)
    with pytest.raises(DataError, match=r"dictionary of field 'txt'.*not a regular file"):
        list(ShardedDataset(compressed))
    assert any("txt.zdict: cannot read" in problem for problem in verify(compressed, quiet=True))


def test_verify_decompresses_the_frames_it_checks(tmp_path: Path) -> None:
    """A manifest that claims compression for a field stored plain (edited, its digest recomputed) passes
    every checksum: decompressing is what finds it."""
    out = pack_dataset(tmp_path, "tar", 12, max_samples=6)
    data = json.loads((out / "manifest.json").read_text())
    data["compression"] = {"txt": {"codec": "zstd", "level": 3, "max_bytes": 1 << 20}}
    data["manifest_version"], data["requires"] = 3, ["compression"]
    data[DIGEST_KEY] = content_digest(data)
    (out / "manifest.json").write_text(json.dumps(data))
    problems = verify(out, quiet=True)
    assert len(problems) == 2  # the first frame of each shard, named
    assert "shard-000000.tar, sample 0: field 'txt'" in problems[0] and "does not decompress" in problems[0]


def test_a_file_name_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.txt").write_text("x")
    (src / os.fsdecode(b"bad\xff\xfename.txt")).write_text("y")
    for order in ("hashed", "sorted"):
        result = CliRunner().invoke(main, ["pack", str(src), str(tmp_path / order), "--format", "tar",
                                           "--order", order])  # fmt: skip
        assert result.exit_code == 2, result.output
        assert r"b'bad\xff\xfename.txt'" in result.output and "not UTF-8" in result.output
        assert not (tmp_path / order / "manifest.json").exists()
