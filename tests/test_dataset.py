"""ShardedDataset and make_loader in one process (plus real DataLoader workers): guarantees per format."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from loaders import ShardedDataset
from shardpipe.errors import DataError
from shardpipe.formats.layout import ShardIndex
from shardpipe.manifest import load_manifest
from tests.datagen import pack_dataset

FORMATS = ["tar", "lmdb", "tfrecord"]


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packed")
    # 47 samples in shards of 7 (the last holds 5): uneven, and fewer shards than 3 ranks x 4 workers
    return {fmt: pack_dataset(root, fmt, 47, max_samples=7) for fmt in FORMATS}


def keys_of(dataset: ShardedDataset) -> list[str]:
    return [s["__key__"] for s in dataset]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_ranks_cover_every_sample_once_with_equal_counts(
    packed: dict[str, Path], fmt: str, remainder: str
) -> None:
    for world_size in (1, 2, 3, 5, 8):
        per_rank = []
        seen: Counter[str] = Counter()
        pads = 0
        for rank in range(world_size):
            dataset = ShardedDataset(
                packed[fmt], remainder=remainder, rank=rank, world_size=world_size, seed=3
            )  # type: ignore[arg-type]
            samples = list(dataset)
            assert len(samples) == len(dataset)
            per_rank.append(len(samples))
            seen.update(s["__key__"] for s in samples if not s["__pad__"])
            pads += sum(s["__pad__"] for s in samples)
        assert len(set(per_rank)) == 1
        if remainder == "pad":
            assert per_rank[0] == -(-47 // world_size) and len(seen) == 47 and set(seen.values()) == {1}
            assert pads == world_size * per_rank[0] - 47
        else:
            assert per_rank[0] == 47 // world_size and set(seen.values()) == {1} and pads == 0
            assert len(seen) == world_size * per_rank[0]


def test_formats_yield_identical_samples(packed: dict[str, Path]) -> None:
    runs = []
    for fmt in FORMATS:
        dataset = ShardedDataset(packed[fmt], rank=1, world_size=2, seed=5)
        runs.append([(s["__key__"], s["bin"], s["txt"], s["cls"], s["__pad__"]) for s in dataset])
    assert runs[0] == runs[1] == runs[2]


def test_order_depends_only_on_seed_and_epoch(packed: dict[str, Path]) -> None:
    def order(seed: int, epoch: int) -> list[str]:
        dataset = ShardedDataset(packed["tar"], seed=seed, rank=0, world_size=1, shuffle_buffer=8)
        dataset.set_epoch(epoch)
        return keys_of(dataset)

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1)
    assert order(1, 0) != order(2, 0)
    assert sorted(order(1, 0)) == sorted(order(1, 1))
    unshuffled = ShardedDataset(packed["tar"], shuffle=False, rank=0, world_size=1)
    assert keys_of(unshuffled) == sorted(keys_of(unshuffled))


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
@pytest.mark.parametrize("persistent", [True, False])
def test_set_epoch_reaches_workers(packed: dict[str, Path], context: str, persistent: bool) -> None:
    def fresh_order(epoch: int) -> list[str]:
        dataset = ShardedDataset(packed["tar"], rank=0, world_size=1, seed=1, batch_size=4)
        dataset.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=4, num_workers=2, multiprocessing_context=context
        )
        return [k for batch in loader for k in batch["__key__"]]

    dataset = ShardedDataset(packed["tar"], rank=0, world_size=1, seed=1, batch_size=4)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=4, num_workers=2, persistent_workers=persistent, multiprocessing_context=context
    )
    orders = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        orders.append([k for batch in loader for k in batch["__key__"]])
    assert orders[0] != orders[1] != orders[2]
    assert orders[2] == fresh_order(2)


def test_decode_and_transform_run_in_the_dataset(packed: dict[str, Path]) -> None:
    dataset = ShardedDataset(
        packed["tar"], decode={"cls": "cls"}, rank=0, world_size=1, transform=lambda s: s["cls"]
    )
    classes = load_manifest(packed["tar"]).classes
    assert classes is not None and all(isinstance(c, int) and 0 <= c < len(classes) for c in dataset)
    with pytest.raises(ValueError, match="unknown decoder"):
        ShardedDataset(packed["tar"], decode={"txt": "nope"}, rank=0, world_size=1)


def test_close_and_context_manager_release_and_reopen(packed: dict[str, Path]) -> None:
    with ShardedDataset(packed["tar"], rank=0, world_size=1, shuffle=False) as dataset:
        first = keys_of(dataset)
    assert keys_of(dataset) == first  # closed readers reopen lazily


def damage(out: Path, fmt: str) -> str:
    """Break shard 1 the way each format can notice: a tar header, a TFRecord byte, a truncated LMDB file."""
    manifest = load_manifest(out)
    entry = manifest.splits["train"][1]
    shard = out / entry.path
    data = bytearray(shard.read_bytes())
    if fmt == "lmdb":
        shard.write_bytes(bytes(data[: len(data) // 2]))
        return "truncated"
    offsets = ShardIndex.read(out / str(entry.index_path), entry.num_samples, manifest.fields).offsets
    data[int(offsets[3]) + (0 if fmt == "tar" else 20)] ^= 0xFF  # sample 3's header / record
    shard.write_bytes(bytes(data))
    return "sample 3"


@pytest.mark.parametrize("fmt", FORMATS)
def test_corrupt_shard_names_itself_or_is_skipped(tmp_path: Path, fmt: str) -> None:
    out = pack_dataset(tmp_path, fmt, 20, max_samples=10)
    where = damage(out, fmt)
    dataset = ShardedDataset(out, rank=0, world_size=1, shuffle=False)
    with pytest.raises(DataError, match=f"shard-000001.{fmt}.*{where}"):
        list(dataset)
    skipping = ShardedDataset(out, rank=0, world_size=1, shuffle=False, on_error="skip")
    samples = list(skipping)
    assert len(samples) == len(skipping) == 20  # steps stay equal: bad slots become flagged pads
    assert skipping.num_errors == (10 if fmt == "lmdb" else 1)
    assert sum(s["__pad__"] for s in samples) == skipping.num_errors
    assert len({s["__key__"] for s in samples if not s["__pad__"]}) == 20 - skipping.num_errors


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_window_with_no_readable_sample_takes_the_first_readable_one(tmp_path: Path, fmt: str) -> None:
    """Skipping with windows of one sample, every bad sample is a window with nothing readable to copy:
    its slot takes the dataset's first readable sample, flagged, and steps stay equal."""
    out = pack_dataset(tmp_path, fmt, 20, max_samples=10)
    damage(out, fmt)
    skipping = ShardedDataset(out, rank=0, world_size=1, shuffle=False, shuffle_buffer=1, on_error="skip")
    samples = list(skipping)
    assert len(samples) == 20 and skipping.num_errors == (10 if fmt == "lmdb" else 1)
    pads = [s for s in samples if s["__pad__"]]
    first = next(iter(ShardedDataset(out, rank=0, world_size=1, shuffle=False, shuffle_buffer=1)))
    assert len(pads) == skipping.num_errors and {s["__key__"] for s in pads} == {first["__key__"]}


def test_warns_once_when_a_sorted_labelled_pack_is_read_with_coarse_windows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sorted_pack = pack_dataset(tmp_path / "sorted", "tar", 20)  # a fresh manifest: not warned about yet
    with caplog.at_level("WARNING", logger="loaders"):
        ShardedDataset(sorted_pack, rank=0, world_size=1)  # defaults: 256 blocks per window
        assert "batches will hold few classes" not in caplog.text
        ShardedDataset(sorted_pack, rank=0, world_size=1, block_size=256)
        ShardedDataset(sorted_pack, rank=0, world_size=1, block_size=256)
        assert caplog.text.count("batches will hold few classes") == 1
        assert (
            "block_size <= 16 or shuffle_buffer >= 16384" in caplog.text and "--order hashed" in caplog.text
        )
        caplog.clear()
        again = pack_dataset(tmp_path / "again", "tar", 20)
        ShardedDataset(again, rank=0, world_size=1, block_size=1, shuffle_buffer=16)  # no smaller block helps
        assert "Use shuffle_buffer >= 64, or repack" in caplog.text and "block_size <=" not in caplog.text
        caplog.clear()
        hashed = pack_dataset(tmp_path / "hashed", "tar", 20, order="hashed")
        ShardedDataset(hashed, rank=0, world_size=1, block_size=256)
        assert "few classes" not in caplog.text


def test_default_block_size_follows_the_pack_order(tmp_path: Path) -> None:
    """A hashed pack is mixed already: long blocks; a sorted one reads small blocks so batches mix."""
    from loaders.planning.mixing import HASHED_BLOCK_SIZE
    from loaders.planning.planner import DEFAULT_BLOCK_SIZE

    hashed = pack_dataset(tmp_path / "h", "tar", 20, order="hashed")
    ordered = pack_dataset(tmp_path / "s", "tar", 20, order="sorted")
    assert ShardedDataset(hashed, rank=0, world_size=1).options.block_size == HASHED_BLOCK_SIZE
    assert ShardedDataset(ordered, rank=0, world_size=1).options.block_size == DEFAULT_BLOCK_SIZE
    assert ShardedDataset(hashed, rank=0, world_size=1, block_size=8).options.block_size == 8


@pytest.mark.parametrize("fmt", FORMATS)
def test_windows_read_across_shards_yield_what_shard_by_shard_reads_yield(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window read and cut in one pass over its shards gives the samples, the pads, the skipped slots and
    the errors of reading it shard by shard (every window takes the one-pass path here)."""
    from loaders.reading.readers import ShardReaders
    from shardpipe.formats import joined

    out = pack_dataset(tmp_path, fmt, 47, max_samples=7)
    monkeypatch.setattr(joined, "JOINED_MIN_SAMPLES", 1)
    one_pass = ShardReaders.locate
    used = []

    def spied(self: ShardReaders, *args: object, **kwargs: object) -> object:
        result = one_pass(self, *args, **kwargs)  # type: ignore[arg-type]
        used.append(result is not None)  # not the window: it holds its readers open
        return result

    def read_all(**kw: object) -> list[tuple[object, ...]]:
        samples = []
        for rank in range(3):
            dataset = ShardedDataset(
                out, rank=rank, world_size=3, seed=2, shuffle_buffer=12, block_size=2, **kw
            )
            samples += [(s["__key__"], s["bin"], s["cls"], s["__pad__"]) for s in dataset]
        return samples

    def both_ways(**kw: object) -> tuple[object, object]:
        results = []
        for locate in (spied, lambda *args, **kwargs: None):
            monkeypatch.setattr(ShardReaders, "locate", locate)
            try:
                results.append(read_all(**kw))
            except DataError as exc:
                results.append(str(exc))
        return results[0], results[1]

    across, by_shard = both_ways()
    assert across == by_shard and len(across) == 48
    assert used and all(used)
    where = damage(out, fmt)
    across, by_shard = both_ways()
    assert across == by_shard and where in str(across)  # the same error, naming the same sample
    across, by_shard = both_ways(on_error="skip")
    assert across == by_shard and sum(pad for *_, pad in across) > 1  # the padding sample, and bad ones


def test_workers_freeze_the_objects_they_inherit_and_the_main_process_does_not(
    packed: dict[str, Path],
) -> None:
    """A worker's collector stops walking the trainer's heap it inherited; the trainer's own is left alone."""
    dataset = ShardedDataset(packed["tar"], rank=0, world_size=1)
    before = gc.get_freeze_count()
    list(dataset)
    assert gc.get_freeze_count() == before
    probe = torch.utils.data.DataLoader(_FreezeProbe(dataset), batch_size=None, num_workers=1)
    assert next(iter(probe)) > 1000  # torch alone leaves far more than that in a worker


class _FreezeProbe(torch.utils.data.IterableDataset[int]):
    """Iterates the dataset in a worker, then reports how many objects that worker froze."""

    def __init__(self, dataset: ShardedDataset) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[int]:
        next(iter(self.dataset))
        yield gc.get_freeze_count()


def test_a_dropped_dataset_closes_its_shards_without_the_garbage_collector(tmp_path: Path) -> None:
    """Nothing a pass builds (a window reader, its repair of bad samples) holds its owner in a reference
    cycle, so the shards close as soon as the dataset and its pass are dropped: an LMDB file stays open
    in its process until then, and a pack, a verify or a test that opens it again would fail."""
    from shardpipe.formats import lmdb_env

    root = pack_dataset(tmp_path, "lmdb", 12, max_samples=5)
    files = {(s.st_dev, s.st_ino) for s in (p.stat() for p in root.rglob("*.lmdb"))}
    assert files
    gc.disable()
    try:
        assert len(list(ShardedDataset(root, "train", shuffle=False))) == 12
        assert not files & set(lmdb_env._shared), "a shard is still open after its dataset was dropped"
    finally:
        gc.enable()
