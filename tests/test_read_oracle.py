"""The read oracle: every sample the loaders hand out equals, byte for byte, what an independent reader finds
in the shards (tarfile, the tfrecord package, LMDB records decoded one by one, zstd frames decompressed
with the pack's dictionary), for every format, small samples and large ones (which land in buffers of
their own), shuffled or in order, compressed or not, on the batch path and the per-sample path, in a
mixture, by random access, with a damaged sample skipped, and in batches held while later windows reuse
the readers' buffers. The guard for any change to the read path."""

from __future__ import annotations

import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
import zstandard

from loaders import Mixture, ShardedDataset, ShardedMapDataset, make_loader
from loaders.batches import collate_samples
from shardpipe.formats import framing, joined
from shardpipe.formats.landing import LANDED_MIN_BYTES
from shardpipe.formats.layout import ShardIndex
from shardpipe.manifest import load_manifest
from shardpipe.packing import PackOptions, pack
from tests.datagen import make_tree

FORMATS = ("tar", "lmdb", "tfrecord")
SIZES = {"small": 100, "large": LANDED_MIN_BYTES + 1000}
Samples = dict[str, dict[str, bytes]]


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, bool], Path]:
    """Every format, sample size and compression: 23 samples in shards of 5."""
    root = tmp_path_factory.mktemp("oracle")
    out = {}
    for size_name, size in SIZES.items():
        src = root / f"src-{size_name}"
        make_tree(src, 23, size=size)
        for fmt in FORMATS:
            for compressed in (False, True):
                options = PackOptions(
                    format=fmt, max_samples=5, labels="dirname", compress="zstd" if compressed else None
                )
                dest = root / f"{fmt}-{size_name}-{int(compressed)}"
                pack(src, dest, options, quiet=True)
                out[fmt, size_name, compressed] = dest
    return out


def reference(root: Path) -> Samples:
    """Every sample of the pack, read shard by shard without the loaders, compressed fields decompressed."""
    manifest = load_manifest(root)
    samples: Samples = {}
    for entry in manifest.split_shards("train"):
        samples.update(_read_shard(root / entry.path, manifest.format, manifest.fields))
    for name, codec in manifest.compression.items():
        dictionary = None
        if codec.dictionary is not None:
            dictionary = zstandard.ZstdCompressionDict((root / codec.dictionary).read_bytes())
        decompress = zstandard.ZstdDecompressor(dict_data=dictionary).decompress
        for fields in samples.values():
            if name in fields:
                fields[name] = decompress(fields[name], max_output_size=1 << 24)
    return samples


def _read_shard(path: Path, fmt: str, fields: Iterable[str]) -> Samples:
    samples: Samples = {}
    if fmt == "tar":
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                folder, _, name = member.name.rpartition("/")
                stem, _, field = name.partition(".")
                data = tar.extractfile(member)
                assert data is not None
                samples.setdefault(f"{folder}/{stem}" if folder else stem, {})[field] = data.read()
    elif fmt == "tfrecord":
        from tfrecord.reader import tfrecord_loader

        description = {"__key__": "byte", **dict.fromkeys(fields, "byte")}
        for record in tfrecord_loader(str(path), None, description):
            key = bytes(record.pop("__key__")).decode()
            samples[key] = {name: bytes(value) for name, value in record.items()}
    else:
        with lmdb.open(str(path), subdir=False, readonly=True, lock=False) as env, env.begin() as txn:
            for index, record in txn.cursor():
                if index.startswith(b"__"):  # the shard's count and version, not samples
                    continue
                key, values = framing.decode(record)
                samples[key] = {name: bytes(value) for name, value in values.items()}
    return samples


def check_batches(
    batches: Iterable[dict[str, Any]], expected: Samples, *, source: list[Samples] | None = None
) -> int:
    """Assert every sample of ``batches`` equals its reference (a mixture's by its source); return how
    many were pads."""
    pads = 0
    for batch in batches:
        keys, flags = batch["__key__"], np.asarray(batch["__pad__"]).tolist()
        for i, key in enumerate(keys):
            pads += bool(flags[i])
            want = source[int(batch["__source__"][i])][key] if source is not None else expected[key]
            got = {name: bytes(batch[name][i]) for name in want}
            assert got == want, f"{key}: the loaders' bytes differ from the shard's"
    return pads


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "zstd"])
def test_every_sample_is_the_shards_byte_for_byte(
    packs: dict[tuple[str, str, bool], Path], fmt: str, size: str, compressed: bool
) -> None:
    root = packs[fmt, size, compressed]
    expected = reference(root)
    assert len(expected) == 23
    for shuffle in (True, False):
        for kwargs in ({}, {"collate_fn": collate_samples}):  # the batch path, the per-sample path
            dataset = ShardedDataset(root, rank=0, world_size=1, seed=3, shuffle=shuffle, shuffle_buffer=8)
            batches = list(make_loader(dataset, batch_size=4, num_workers=0, **kwargs))
            assert check_batches(batches, expected) == 0
            assert sorted(k for b in batches for k in b["__key__"]) == sorted(expected)
    by_position = ShardedMapDataset(root)
    picks = [22, 0, 7, 7, 13]
    batch = by_position.get_batch(picks)
    assert check_batches([batch], expected) == 0 and len(batch["__key__"]) == len(picks)


def test_a_mixture_hands_out_each_sources_own_bytes(packs: dict[tuple[str, str, bool], Path]) -> None:
    roots = [packs["tar", "small", False], packs["lmdb", "large", True], packs["tfrecord", "small", True]]
    expected = [reference(root) for root in roots]  # before the loaders open the LMDB environment
    sources = {f"s{i}": ShardedDataset(root, rank=0, world_size=1, seed=1) for i, root in enumerate(roots)}
    mixture = Mixture(sources, {"s0": 0.5, "s1": 0.3, "s2": 0.2}, samples_per_epoch=40)
    batches = list(make_loader(mixture, batch_size=4, num_workers=0))
    assert check_batches(batches, {}, source=expected) == 0
    assert sum(len(b["__key__"]) for b in batches) == 40


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_a_damaged_sample_is_skipped_and_every_other_is_the_shards(
    packs: dict[tuple[str, str, bool], Path], fmt: str, tmp_path: Path
) -> None:
    import shutil

    root = Path(shutil.copytree(packs[fmt, "large", False], tmp_path / "damaged"))
    expected = reference(root)
    manifest = load_manifest(root)
    entry = manifest.split_shards("train")[1]
    offsets = ShardIndex.read(root / str(entry.index_path), entry.num_samples, manifest.fields).offsets
    shard = bytearray((root / entry.path).read_bytes())
    shard[(int(offsets[3]) + int(offsets[4])) // 2] ^= 0xFF  # the middle of sample 3's bytes
    (root / entry.path).write_bytes(bytes(shard))
    dataset = ShardedDataset(root, rank=0, world_size=1, seed=3, on_error="skip")
    batches = list(make_loader(dataset, batch_size=4, num_workers=0))
    assert check_batches([_real(b) for b in batches], expected) == 0
    assert dataset.num_errors == 1 == sum(int(np.asarray(b["__pad__"]).sum()) for b in batches)


def _real(batch: dict[str, Any]) -> dict[str, Any]:
    """The samples of a batch that are not pads (a skipped sample's slot is a flagged stand-in)."""
    keep = [i for i, pad in enumerate(np.asarray(batch["__pad__"]).tolist()) if not pad]
    return {
        name: [value[i] for i in keep] if name != "__pad__" else np.zeros(len(keep), dtype=bool)
        for name, value in batch.items()
    }


@pytest.mark.parametrize("fmt", FORMATS)
def test_batches_held_across_windows_keep_the_shards_bytes(
    packs: dict[tuple[str, str, bool], Path], fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows of small samples are read into one buffer each reader reuses, window after window (for
    tar and TFRecord the one-buffer path, forced here for a small pack): what they hand out is copied
    out of it, so every batch of two epochs, held to the end, still holds the shards' bytes."""
    monkeypatch.setattr(joined, "JOINED_MIN_SAMPLES", 1)
    root = packs[fmt, "small", False]
    expected = reference(root)
    for kwargs in ({}, {"collate_fn": collate_samples}):  # the batch path, the per-sample path
        dataset = ShardedDataset(root, seed=3, shuffle_buffer=8)
        loader = make_loader(dataset, batch_size=4, num_workers=0, **kwargs)
        held = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            held += list(loader)
        assert check_batches(held, expected) == 0
        assert sum(len(batch["__key__"]) for batch in held) == 2 * len(expected)
