"""``shardpipe inspect``'s summary: counts and spreads from the manifest, and its order rule."""

from __future__ import annotations

from pathlib import Path

from shardpipe.manifest import Manifest, write_manifest
from shardpipe.shardtable import ShardEntry
from shardpipe.storage import open_store
from shardpipe.tools.inspection import inspect, render


def _entry(i: int, samples: int, num_bytes: int) -> ShardEntry:
    path = f"train/shard-{i:06d}.tar"
    return ShardEntry(path, samples, num_bytes, "0" * 64, f"{path}.idx", "1" * 64)


def test_summary_counts_and_spreads(tmp_path: Path) -> None:
    splits = {
        "train": (_entry(0, 10, 3_000_000), _entry(1, 4, 1_000_000), _entry(2, 7, 2_000_000)),
        "val": (),
    }
    order = {"method": "hashed", "rule": "r", "seed": 9}
    manifest = Manifest("tar", ("cls", "png"), splits, {"seed": 9}, classes=("a", "b"), order=order)
    write_manifest(open_store(tmp_path), manifest)
    summary = inspect(tmp_path)
    train = summary["splits"]["train"]
    assert (train["shards"], train["samples"], train["bytes"]) == (3, 21, 6_000_000)
    assert train["shard_samples"] == {"min": 4, "median": 7, "max": 10}
    assert summary["splits"]["val"]["samples"] == 0 and summary["order"] == order
    text = render(summary)
    assert "order: hashed (seed 9)" in text and "classes: a, b" in text
    assert "train            3           21        6.0   4 / 7 / 10" in text


def test_manifest_without_an_order_renders_without_one(tmp_path: Path) -> None:
    write_manifest(open_store(tmp_path), Manifest("lmdb", ("bin",), {"train": (_entry(0, 1, 10),)}, {}))
    summary = inspect(tmp_path)
    assert summary["order"] is None and "order:" not in render(summary)


def test_compressed_fields_show_their_size_as_given_and_as_stored(tmp_path: Path) -> None:
    """A pack records each compressed field's bytes per shard; inspect sums them into a ratio."""
    from shardpipe.packing import PackOptions, pack
    from shardpipe.packing.split import parse_split

    (tmp_path / "src").mkdir()
    for i in range(40):
        (tmp_path / "src" / f"{i:03d}.json").write_text('{"caption": "a photo of a cat on a mat"}' * 8)
        (tmp_path / "src" / f"{i:03d}.bin").write_bytes(bytes([i]) * 50)
    options = PackOptions(format="tfrecord", compress="zstd", compress_fields=("json",), max_samples=15,
                          split=parse_split(None))  # fmt: skip
    pack(tmp_path / "src", tmp_path / "out", options, quiet=True)
    summary = inspect(tmp_path / "out")["compression"]["json"]
    assert summary["given_bytes"] == 40 * 8 * 40  # the values as they came, over the three shards
    assert 0 < summary["stored_bytes"] < summary["given_bytes"]
    ratio = summary["given_bytes"] / summary["stored_bytes"]
    assert f"{ratio:,.2f}x" in render(inspect(tmp_path / "out"))
