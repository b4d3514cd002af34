"""Large samples read straight into their batches (``formats.landing``): the same batches as the general
path, byte for byte, in every format; the same errors; and no fault when a mapped file is cut short."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import xxhash

from loaders import ShardedDataset, make_loader
from loaders.batches import RaggedBytes
from loaders.reading.readers import ShardReaders
from shardpipe.errors import CorruptShardError, DataError
from shardpipe.formats import bytecolumn, framing, get_format, landing, leases
from shardpipe.formats.landing import LANDED_MIN_BYTES, Spans
from shardpipe.formats.layout import ShardIndex
from shardpipe.formats.leases import BufferPool
from shardpipe.formats.readbuffer import ReadBuffer
from shardpipe.manifest import load_manifest
from shardpipe.packing import PackOptions, pack
from tests.datagen import payload

FORMATS = ["tar", "tfrecord", "lmdb"]
NUM_SAMPLES, PER_SHARD = 29, 6


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """29 samples over shards of 6: a large field that lands, a small one and the label that ride along."""
    root = tmp_path_factory.mktemp("landing")
    src = root / "src"
    for i in range(NUM_SAMPLES):
        key = f"c{i % 2}/{i:03d}"
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        (src / f"{key}.bin").write_bytes(payload(key, "bin", LANDED_MIN_BYTES + 997 * i))
        (src / f"{key}.txt").write_bytes(payload(key, "txt", 1 + i))
    for fmt in FORMATS:
        options = PackOptions(format=fmt, max_samples=PER_SHARD, labels="dirname")
        pack(src, root / fmt, options, quiet=True)
    return {fmt: root / fmt for fmt in FORMATS}


def batches(path: Path, *, lands: bool, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Every batch of two epochs of a shuffled pack, as plain lists; ``lands=False`` takes the general
    path. Asserts that the landing path ran, or did not."""
    located: list[object] = []
    real = ShardReaders.locate
    with monkeypatch.context() as patch:
        patch.setattr(
            ShardReaders,
            "locate",
            lambda self, *a, **kw: located.append(real(self, *a, **kw) if lands else None) or located[-1],
        )
        dataset = ShardedDataset(path, rank=1, world_size=2, seed=3, shuffle_buffer=11, decode={"cls": "cls"})
        loader = make_loader(dataset, batch_size=4, num_workers=0)
        out = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            for batch in loader:
                assert isinstance(batch["bin"], RaggedBytes)
                out.append({k: v if isinstance(v, list) else v.tolist() for k, v in batch.items()})
    assert located and all((window is not None) == lands for window in located)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_landed_batches_are_the_general_paths_byte_for_byte(
    packed: dict[str, Path], fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    landed = batches(packed[fmt], lands=True, monkeypatch=monkeypatch)
    assert landed == batches(packed[fmt], lands=False, monkeypatch=monkeypatch)
    keys = [key for batch in landed[: len(landed) // 2] for key in batch["__key__"]]
    assert len(keys) == 15 and len(set(keys)) == 15  # rank 1's half of an epoch of 29, one pad


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_landed_column_is_one_buffer_no_batch_copies(packed: dict[str, Path], fmt: str) -> None:
    loader = make_loader(ShardedDataset(packed[fmt], shuffle_buffer=8), batch_size=4, num_workers=0)
    column = next(iter(loader))["bin"]
    assert isinstance(column.buffer, memoryview) and column.buffer.readonly  # a view, not a copy
    assert [len(v) for v in column] == np.diff(column.offsets).tolist()


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_batches_held_across_epochs_never_change(packed: dict[str, Path], workers: int) -> None:
    """Landed columns (in the reader, or in the main process's copies of the workers' batches) live in
    pooled buffers: every batch kept for three epochs still holds its own samples at the end."""
    dataset = ShardedDataset(packed["tar"], shuffle_buffer=8)
    loader = make_loader(dataset, batch_size=4, num_workers=workers)
    held = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        held += list(loader)
    for batch in held:
        sizes = [LANDED_MIN_BYTES + 997 * int(key[-3:]) for key in batch["__key__"]]
        expected = [payload(key, "bin", size) for key, size in zip(batch["__key__"], sizes, strict=True)]
        assert [bytes(value) for value in batch["bin"]] == expected


def _copy(path: Path, to: Path) -> Path:
    shutil.copytree(path, to)
    return to


def _shard_order(path: Path) -> list[str]:
    """The keys in shard order."""
    return [sample["__key__"] for sample in ShardedDataset(path, shuffle=False)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_damaged_large_sample_is_named_or_skipped(
    packed: dict[str, Path], fmt: str, tmp_path: Path
) -> None:
    out = _copy(packed[fmt], tmp_path / fmt)
    key = _shard_order(out)[PER_SHARD + 2]  # sample 2 of shard 1
    shard = out / load_manifest(out).splits["train"][1].path
    data = bytearray(shard.read_bytes())
    i = int(key.rsplit("/", 1)[1])
    at = data.find(payload(key, "bin", LANDED_MIN_BYTES + 997 * i)[:64])
    assert at > 0
    data[at + 5000] ^= 0xFF  # inside the landed field
    shard.write_bytes(bytes(data))
    loader = make_loader(ShardedDataset(out, shuffle=False), batch_size=4, num_workers=0)
    with pytest.raises(DataError, match=f"shard-000001.{fmt}.*sample 2.*checksum"):
        list(loader)
    skipping = ShardedDataset(out, shuffle=False, on_error="skip")
    got = list(make_loader(skipping, batch_size=4, num_workers=0))
    pads = list(itertools.chain.from_iterable(b["__pad__"].tolist() for b in got))
    assert len(pads) == NUM_SAMPLES and sum(pads) == skipping.num_errors == 1


@pytest.mark.parametrize("how", ["window", "scattered", "gets"])
@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_a_mapped_file_cut_short_names_the_sample_instead_of_faulting(
    packed: dict[str, Path], fmt: str, how: str, tmp_path: Path
) -> None:
    """A touch past a mapped file's end would kill the process (SIGBUS): the size is checked first, by a
    window's landing (streamed or scattered) and by random gets' sample-by-sample reads alike."""
    out = _copy(packed[fmt], tmp_path / fmt)
    manifest = load_manifest(out)
    entry = manifest.splits["train"][0]
    index = ShardIndex.read(out / str(entry.index_path), entry.num_samples, manifest.fields)
    shard_format = get_format(fmt)
    with shard_format.open_reader(out / entry.path, index) as reader:
        parts = [(reader, 0, entry.num_samples)]
        window = shard_format.locate(parts, ["bin", "txt"], ReadBuffer(), scattered=how == "scattered")
        assert window is not None

        def read(picks: list[int]) -> list[str]:
            if how == "gets":
                samples = shard_format.read_samples({0: reader}, [(0, i) for i in picks], ["bin", "txt"])
                assert samples is not None
                return [sample["__key__"] for sample in samples]
            assert window is not None
            keys, fields = window.land(np.array(picks), BufferPool())
            assert len(fields["bin"]) == len(picks)
            return keys

        assert len(read([0, 2, 1])) == 3
        with open(out / entry.path, "r+b") as file:
            file.truncate(int(index.offsets[4]) - 10)  # sample 3 ends past the new end
        with pytest.raises(
            CorruptShardError, match=r"shard-000000.*sample 3.*shorter than when it was opened"
        ):
            read([1, 3, 4])
        assert len(read([2, 0])) == 2  # what the file still holds reads on


def _spans(sources: list[bytes], rows: list[tuple[int, ...]], *, checked: bool) -> Spans:
    """Spans of ``rows``: (begin, end, key start, key stop, then start and stop of each field)."""
    table = np.array(rows, np.int64)
    digests = [xxhash.xxh3_64_intdigest(sources[i][r[0] : r[1]]) for i, r in enumerate(rows)]
    checksums = np.array(digests, np.uint64) if checked else None
    begins, ends, key_starts, key_stops = table[:, :4].T
    views = [memoryview(source) for source in sources]
    return Spans(views, begins, ends, checksums, key_starts, key_stops, table[:, 4::2], table[:, 5::2])


def _land(spans: Spans, landed: list[bool]) -> tuple[list[str], dict]:
    names = ["big", "small"][: len(landed)]
    return landing.land(spans, names, lambda i: ("shard-x", i), landed=np.array(landed), pool=BufferPool())


def test_land_copies_large_fields_into_one_buffer_and_the_rest_one_by_one() -> None:
    first, second = b"..k1" + b"A" * 20 + b"s1", b"k2!" + b"B" * 30 + b"xx"
    rows = [(0, len(first), 2, 4, 4, 24, 24, 26), (0, len(second), 0, 2, 3, 33, -1, -1)]
    keys, fields = _land(_spans([first, second], rows, checked=True), [True, False])
    assert keys == ["k1", "k2"]
    assert fields["big"].to_pylist() == [b"A" * 20, b"B" * 30] and fields["small"] == [b"s1", None]
    damaged = _spans([first, second], rows, checked=True)
    assert damaged.checksums is not None
    damaged.checksums[1] ^= 1
    with pytest.raises(CorruptShardError, match="shard-x, sample 1, byte 0: sample bytes differ"):
        _land(damaged, [True, False])
    bad_key = _spans([b"\xff\xfeAAAA"], [(0, 6, 0, 2, 2, 6)], checked=False)
    with pytest.raises(CorruptShardError, match="shard-x, sample 0: key is not UTF-8"):
        _land(bad_key, [True])


def test_land_gathers_samples_of_one_buffer_in_the_order_asked_and_checks_every_one() -> None:
    """Samples end to end in one buffer (small ones, read together) are gathered in one take per field, in
    ``order``, a field a sample lacks ``None``; a damaged sample is named even when not picked (what was
    read is checked), by its position among the spans."""
    samples = [(b"k%d" % i, b"v" * i, b"w%d" % i) for i in range(6)]
    data = b"".join(key + value + label for key, value, label in samples)
    rows, at = [], 0
    for i, (key, value, label) in enumerate(samples):
        value_at, label_at, end = at + len(key), at + len(key) + len(value), at + len(key + value + label)
        rows.append((at, end, at, value_at, value_at, label_at, *((-1, -1) if i == 4 else (label_at, end))))
        at = end
    table = np.array(rows, np.int64)
    checksums = np.array([xxhash.xxh3_64_intdigest(data[r[0] : r[1]]) for r in rows], np.uint64)
    spans = Spans(
        memoryview(data), *table[:, :2].T, checksums, *table[:, 2:4].T, table[:, 4::2], table[:, 5::2]
    )
    order = np.array([5, 0, 4, 2])
    keys, fields = landing.land(spans, ["big", "small"], lambda i: ("shard-x", i), order=order)
    assert keys == ["k5", "k0", "k4", "k2"]
    assert bytecolumn.values(fields["big"]) == [b"vvvvv", b"", b"vvvv", b"vv"]
    assert bytecolumn.values(fields["small"]) == [b"w5", b"w0", None, b"w2"]
    checksums[3] ^= 1  # sample 3 is read, not picked
    with pytest.raises(CorruptShardError, match="shard-x, sample 3, byte"):
        landing.land(spans, ["big"], lambda i: ("shard-x", i), order=order)


def _sizes(records: Sequence[bytes | memoryview]) -> np.ndarray:
    return np.array([len(record) for record in records], np.int64)


def test_record_spans_agree_with_decode_and_refuse_a_record_that_differs() -> None:
    """Where they lie or end to end in one buffer, the spans of each record are where ``decode`` finds its
    key and fields."""
    records = [framing.encode(f"k{i}", {"a": b"x" * (i + 1), "b": b"y" * (10 * i + 3)}) for i in range(5)]
    views = [memoryview(record) for record in records]
    joined = memoryview(b"".join(records))
    for source in (views, joined):
        spans = framing.record_spans(source, _sizes(views), ["b", "z", "a"], version=2, check=True)
        assert spans is not None and spans.checksums is not None and not spans.in_file
        for i, record in enumerate(records):
            view = spans.each()[i]
            key, fields = framing.decode(record)
            assert bytes(view[spans.key_starts[i] : spans.key_stops[i]]).decode() == key
            assert view[spans.starts[i, 0] : spans.stops[i, 0]] == fields["b"]
            assert view[spans.starts[i, 2] : spans.stops[i, 2]] == fields["a"]
            assert spans.starts[i, 1] == -1  # no field z
            assert xxhash.xxh3_64_intdigest(view[spans.begins[i] : spans.ends[i]]) == spans.checksums[i]
    other = framing.encode("k9", {"a": b"x", "c": b"y"})  # other field names: decoded one by one instead
    differ = [*views, memoryview(other)]
    assert framing.record_spans(differ, _sizes(differ), ["a"], version=2, check=True) is None
    short = [views[0], memoryview(records[1][:-3])]  # the header disagrees with the length
    assert framing.record_spans(short, _sizes(short), ["a"], version=2, check=True) is None
    assert framing.record_spans(views, _sizes([]), ["a"], version=2, check=True) is None


def test_of_the_smallest_idle_buffers_that_fit_the_one_taken_last_is_reused() -> None:
    """A window's pieces differ a little in size: they share buffers made a size class at a time, and the
    one the last piece took, still in the CPU cache, serves the next, where the first of the list did and
    a mixture cycled through all of them."""
    pool = leases.BufferPool()

    def address(view: np.ndarray) -> int:
        return int(view.__array_interface__["data"][0])

    first, second = pool.take(1000), pool.take(1010)  # one size class
    addresses = [address(first), address(second)]
    del first, second
    assert address(pool.take(1020)) == addresses[1]
    large = pool.take(5000)
    del large
    held = pool.take(900)  # the smallest that fits, of those the one taken last
    assert address(held) == addresses[1] and address(pool.take(1000)) == addresses[0]


def test_a_pooled_buffer_is_reused_only_once_nothing_holds_it() -> None:
    pool = leases.BufferPool()
    first = pool.take(1000)
    address = first.__array_interface__["data"][0]
    held = pool.take(500)  # ``first`` is still held: another buffer
    assert held.__array_interface__["data"][0] != address
    del first
    again = pool.take(800)  # free now, and large enough
    assert again.__array_interface__["data"][0] == address and len(again) == 800
    bigger = pool.take(5000)  # none free is large enough: a new one
    assert bigger.__array_interface__["data"][0] not in (address, held.__array_interface__["data"][0])
    kept = [pool.take(10) for _ in range(2 * leases.POOLED_BUFFERS)]  # all held: the pool stops growing
    assert len(pool._buffers) == leases.POOLED_BUFFERS and all(len(b) == 10 for b in kept)
    del held, bigger, kept  # ``again`` still holds the first pooled buffer
    large = pool.take(10_000)  # the pool is full and no idle buffer is large enough: one is replaced
    assert len(large) == 10_000 and len(pool._buffers) == leases.POOLED_BUFFERS
    assert _address(again) == _address(pool._buffers[0])
    huge = pool.take(leases.POOLED_BYTES + 1)  # past the pool's bytes: handed out, never kept
    assert len(huge) == leases.POOLED_BYTES + 1 and _address(huge) not in map(_address, pool._buffers)
    small = leases.BufferPool(max_buffers=2, max_bytes=1100)  # bounds of its own (400 bytes take 512)
    held_small = [small.take(400) for _ in range(3)]
    pooled = list(map(_address, small._buffers))
    assert [_address(h) in pooled for h in held_small] == [True, True, False]  # the third is not kept


def test_a_lease_lasts_as_long_as_anything_cut_from_it() -> None:
    """Views of views, tensors and Arrow buffers all keep the buffer out of the pool; it comes back only
    once the last of them is gone, and a kept one never changes while the pool serves other takes."""
    pool = leases.BufferPool()
    lease = pool.take(1000)
    lease[:] = 7
    held = [lease[10:20][2:5], torch.from_numpy(lease[100:200]), pa.py_buffer(lease[300:400])]
    address = _address(lease)
    del lease
    for _ in range(3):
        other = pool.take(900)  # never the held buffer
        assert _address(other) != address
        other[:] = 1
        del other
    assert bytes(held[0]) == b"\x07" * 3 and bytes(held[1].numpy()) == b"\x07" * 100
    assert held[2].to_pybytes() == b"\x07" * 100
    del held[:2]
    assert _address(pool.take(900)) != address  # the Arrow buffer still holds it
    held.clear()
    first, second = pool.take(900), pool.take(900)  # the two idle buffers of this size, both served
    assert address in (_address(first), _address(second))


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])
