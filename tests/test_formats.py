"""Format round trips, determinism, interop with webdataset / tfrecord, and corruption detection."""

from __future__ import annotations

import contextlib
import io
import os
import struct
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import cast
from unittest import mock

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shardpipe.errors import CorruptShardError, DataError, UsageError
from shardpipe.formats import (
    all_formats,
    bytecolumn,
    framing,
    get_format,
    joined,
    lmdb_env,
    lmdb_reader,
    lmdb_writer,
    spanreader,
)
from shardpipe.formats.base import Format, ShardReader
from shardpipe.formats.joined import JOINED_BYTES
from shardpipe.formats.layout import CHECKSUM, NO_SPAN, ShardIndex, shard_checksums
from shardpipe.formats.leases import BufferPool
from shardpipe.formats.readbuffer import ReadBuffer
from shardpipe.formats.terms import ColumnsOut, Fields
from tests.datagen import read_with_webdataset

FORMATS = sorted(all_formats())
JOIN_BYTES, PIECE_RECORDS = framing._JOIN_BYTES, lmdb_reader._PIECE_RECORDS  # the defaults
Sample = tuple[str, Fields]

_component = st.text(st.characters(categories=["L", "N"], include_characters="_-ü"), min_size=1, max_size=70)
_field = st.from_regex(r"[a-z0-9]{1,6}(\.[a-z0-9]{1,4})?", fullmatch=True)
_samples = st.lists(
    st.tuples(
        st.lists(_component, min_size=1, max_size=3).map("/".join),
        st.dictionaries(_field, st.binary(max_size=1500), min_size=1, max_size=4),
    ),
    max_size=12,
    unique_by=lambda sample: sample[0],
)


def listed(out: ColumnsOut | None) -> tuple[list[str], dict[str, list[bytes | None]]] | None:
    """Columns as plain lists (``None`` stays ``None``), to compare."""
    if out is None:
        return None
    keys, fields = out
    return keys, {name: bytecolumn.values(column) for name, column in fields.items()}


def write(fmt: Format, path: Path, samples: Sequence[Sample]) -> ShardIndex:
    """Write ``samples``; return the shard's index (also a sequence of sample offsets)."""
    writer = fmt.open_writer(path)
    for key, fields in samples:
        writer.write(key, fields)
    return writer.close()


def scan(fmt: Format, path: Path) -> tuple[list[str], ShardIndex, set[str]]:
    """Keys, index and field names of a shard, from a full parse (LMDB's index has no checksums)."""
    keys, layouts, end = fmt.scan(path)
    names = {name for sample in layouts for name in sample.fields}
    checksums = shard_checksums(path, layouts, end) if fmt.needs_index else np.full(len(keys), NO_SPAN)
    return keys, ShardIndex.build(layouts, end, sorted(names), checksums), names


def some_samples(num_samples: int = 20, size: int = 100) -> list[Sample]:
    return [
        (f"c{i % 3}/{i:04d}", {"bin": bytes([i % 256]) * (size + i), "cls": b"%d" % (i % 3)})
        for i in range(num_samples)
    ]


@pytest.mark.parametrize("name", FORMATS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(samples=_samples, data=st.data())
def test_round_trip_and_determinism(name: str, samples: list[Sample], data: st.DataObject) -> None:
    fmt = get_format(name)
    with tempfile.TemporaryDirectory() as tmp:
        path, again = Path(tmp) / f"a{fmt.suffix}", Path(tmp) / f"b{fmt.suffix}"
        offsets = write(fmt, path, samples)
        write(fmt, again, samples)
        assert path.read_bytes() == again.read_bytes()
        assert len(offsets) == len(samples) + 1
        assert list(fmt.read(path, 0, len(samples), offsets)) == samples
        start = data.draw(st.integers(0, len(samples)))
        stop = data.draw(st.integers(start, len(samples)))
        assert list(fmt.read(path, start, stop, offsets)) == samples[start:stop]  # sliced by the index
        plain = offsets.offsets.tolist()
        assert list(fmt.read(path, start, stop, plain)) == samples[start:stop]  # parsed
        keys, scanned, names = scan(fmt, path)
        assert keys == [key for key, _ in samples]
        assert scanned == offsets  # the writer's index is what a scan of the file finds
        assert names == {field for _, fields in samples for field in fields}
        assert sorted(os.listdir(tmp)) == [path.name, again.name]  # no lock or side files


@pytest.mark.parametrize("name", FORMATS)
@settings(max_examples=25, deadline=None)
@given(
    keys=st.lists(st.lists(_component, min_size=1, max_size=3).map("/".join), max_size=12, unique=True),
    names=st.lists(_field, min_size=1, max_size=3, unique=True),
    data=st.data(),
)
def test_one_batch_writes_what_samples_one_by_one_write(
    name: str, keys: list[str], names: list[str], data: st.DataObject
) -> None:
    """The pack stage's path (one ``write_batch`` for many samples) against the per-sample path."""
    columns = [[data.draw(st.binary(max_size=1500)) for _ in keys] for _ in names]
    fmt = get_format(name)
    with tempfile.TemporaryDirectory() as tmp:
        batched, single = Path(tmp) / f"a{fmt.suffix}", Path(tmp) / f"b{fmt.suffix}"
        writer = fmt.open_writer(batched)
        writer.write_batch(keys, names, columns)
        batched_index = writer.close()
        single_index = write(fmt, single, [(k, {n: c[i] for n, c in zip(names, columns, strict=True)})
                                            for i, k in enumerate(keys)])  # fmt: skip
        assert batched.read_bytes() == single.read_bytes()
        assert batched_index == single_index


def test_tar_headers_for_a_batch_equal_headers_built_one_by_one() -> None:
    from shardpipe.formats import tar

    @settings(max_examples=100, deadline=None)
    @given(st.lists(st.tuples(st.binary(min_size=1, max_size=130).map(lambda b: b.replace(b"\0", b"a")),
                              st.integers(0, 8**11 - 1)), min_size=1, max_size=20))  # fmt: skip
    def check(members: list[tuple[bytes, int]]) -> None:
        names, sizes = [name for name, _ in members], np.array([size for _, size in members], dtype=np.int64)
        reference = b"".join(tar._header(name[:100], size, b"0") for name, size in members)
        assert tar._headers(names, sizes) == reference

    check()
    with pytest.raises(DataError, match="ustar shards hold at most"):
        tar._headers([b"a.bin", b"b.bin"], np.array([1, 8**11], dtype=np.int64))


def test_registry_names_each_format() -> None:
    for name, fmt in all_formats().items():
        assert fmt.name == name and fmt.suffix == f".{name}"
    assert [f.needs_index for f in map(get_format, ("tar", "tfrecord", "lmdb"))] == [True, True, False]


# --- tar ---------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnraisableExceptionWarning"
)  # webdataset leaves its file open
def test_tar_reads_in_webdataset_unchanged(tmp_path: Path) -> None:
    samples = [*some_samples(5), ("d" * 120 + "/long", {"seg.png": b"x" * 700}), ("ü/ß", {"txt": b""})]
    path = tmp_path / "s.tar"
    write(get_format("tar"), path, samples)
    assert read_with_webdataset(str(path)) == samples
    with tarfile.open(path) as tar:
        member = tar.getmembers()[0]
        assert (member.mtime, member.uid, member.gid, member.uname, member.mode) == (0, 0, 0, "", 0o444)


@pytest.mark.parametrize("tar_format", ["USTAR_FORMAT", "PAX_FORMAT", "GNU_FORMAT"])
def test_tar_adopts_webdataset_and_tarfile_shards(tmp_path: Path, tar_format: str) -> None:
    import webdataset as wds

    samples = [*some_samples(4), ("e" * 130 + "/deep", {"png": b"p"}), ("ключ/1", {"cls": b"7"})]
    path = tmp_path / "w.tar"
    with wds.TarWriter(str(path), format=tar_format) as sink:
        for key, fields in samples:
            sink.write({"__key__": key, **fields})
    fmt = get_format("tar")
    keys, offsets, names = scan(fmt, path)
    assert keys == [key for key, _ in samples] and names == {"bin", "cls", "png"}
    assert list(fmt.read(path, 0, len(samples), offsets)) == samples
    assert list(fmt.read(path, 4, 6, offsets)) == samples[4:6]


def test_tar_adopts_shard_writer_output(tmp_path: Path) -> None:
    import webdataset as wds

    samples = some_samples(7)
    with wds.ShardWriter(str(tmp_path / "s-%02d.tar"), maxcount=4, verbose=0) as sink:
        for key, fields in samples:
            sink.write({"__key__": key, **fields})
    fmt, got = get_format("tar"), []
    for path in sorted(tmp_path.glob("s-*.tar")):
        keys, offsets, _ = scan(fmt, path)
        got += list(fmt.read(path, 0, len(keys), offsets))
    assert got == samples


def _tar_of(members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([("a/1.png", b"x"), ("b/1.png", b"y"), ("a/1.cls", b"z")], "appears twice"),
        ([("a/1.png", b"x"), ("a/1.png", b"y")], "duplicate member"),
        ([("a/noext", b"x")], "not named"),
    ],
)
def test_tar_scan_rejects_bad_layouts(tmp_path: Path, members: list[tuple[str, bytes]], message: str) -> None:
    path = tmp_path / "bad.tar"
    path.write_bytes(_tar_of(members))
    with pytest.raises(CorruptShardError, match=message):
        get_format("tar").scan(path)


@pytest.mark.parametrize("damage", ["header", "checksum", "truncate", "truncate_header", "no_end"])
def test_tar_corruption_is_reported(tmp_path: Path, damage: str) -> None:
    fmt, path = get_format("tar"), tmp_path / "s.tar"
    offsets = write(fmt, path, some_samples(6))
    raw = bytearray(path.read_bytes())
    second = offsets[1]
    if damage == "header":
        raw[second + 3] ^= 0x01  # inside a name: only the checksum can tell
    elif damage == "checksum":
        raw[second + 150] = ord("7") if raw[second + 150] != ord("7") else ord("6")
    elif damage == "truncate":
        raw = raw[: offsets[3] + 700]
    elif damage == "truncate_header":
        raw = raw[: offsets[3] + 100]
    else:
        raw = raw[: offsets[-1]]
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptShardError) as info:
        fmt.scan(path)
    assert info.value.offset is not None and info.value.shard == str(path)
    if damage in ("header", "checksum"):
        assert "checksum" in str(info.value) and info.value.offset == second
        with pytest.raises(CorruptShardError, match="checksum"):
            list(fmt.read(path, 1, 2, offsets))
        assert len(list(fmt.read(path, 2, 6, offsets))) == 4  # other spans still read


def test_tar_read_checks_the_index(tmp_path: Path) -> None:
    fmt, path = get_format("tar"), tmp_path / "s.tar"
    offsets = write(fmt, path, some_samples(4))
    with pytest.raises(CorruptShardError, match="index says"):
        list(fmt.read(path, 0, 1, [offsets[0], offsets[2]]))
    with pytest.raises(DataError):
        list(fmt.read(path, 0, 1, None))


@pytest.mark.parametrize(
    ("key", "field"), [("a/b.c", "png"), ("a/", "png"), ("a", ""), ("a", "x/y"), ("a", None)]
)
def test_tar_writer_rejects_what_webdataset_would_read_differently(
    tmp_path: Path, key: str, field: str | None
) -> None:
    writer = get_format("tar").open_writer(tmp_path / "s.tar")
    with pytest.raises(DataError, match=r"naming rule|no fields"):
        writer.write(key, {} if field is None else {field: b"x"})
    assert len(writer.close()) == 1  # no sample: only the end offset


# --- TFRecord ----------------------------------------------------------------------------------------


def test_tfrecord_readable_by_tfrecord_package(tmp_path: Path) -> None:
    from tfrecord.reader import tfrecord_loader

    samples = some_samples(5)
    path = tmp_path / "s.tfrecord"
    write(get_format("tfrecord"), path, samples)
    description = {"__key__": "byte", "bin": "byte", "cls": "byte"}
    got = [
        (bytes(r["__key__"]).decode(), {"bin": bytes(r["bin"]), "cls": bytes(r["cls"])})
        for r in tfrecord_loader(str(path), None, description)
    ]
    assert got == samples


def test_tfrecord_reads_foreign_files(tmp_path: Path) -> None:
    from tfrecord.writer import TFRecordWriter

    path = tmp_path / "foreign.tfrecord"
    writer = TFRecordWriter(str(path))
    writer.write(
        {"jpg": (b"\xff\xd8", "byte"), "label": ([3, -1, 2**40], "int"), "box": ([0.1, 2.5], "float")}
    )
    writer.write({"__key__": (b"k/1", "byte"), "jpg": (b"", "byte"), "label": (7, "int")})
    writer.close()
    fmt = get_format("tfrecord")
    keys, offsets, names = scan(fmt, path)
    assert keys == ["foreign/00000000", "k/1"] and names == {"jpg", "label", "box"}
    first, second = fmt.read(path, 0, 2, offsets)
    box = " ".join(repr(x) for x in struct.unpack("<2f", struct.pack("<2f", 0.1, 2.5))).encode()
    assert first == ("foreign/00000000", {"jpg": b"\xff\xd8", "label": b"3 -1 1099511627776", "box": box})
    assert second == ("k/1", {"jpg": b"", "label": b"7"})
    assert list(fmt.read(path, 1, 2, offsets)) == [second]


def test_tfrecord_multi_value_bytes_is_unsupported(tmp_path: Path) -> None:
    from tfrecord.writer import TFRecordWriter

    path = tmp_path / "multi.tfrecord"
    writer = TFRecordWriter(str(path))
    writer.write({"txt": ([b"a", b"b"], "byte")})
    writer.close()
    with pytest.raises(CorruptShardError, match="only one is supported"):
        get_format("tfrecord").scan(path)


@pytest.mark.parametrize(
    ("damage", "message"), [(3, "length CRC"), (9, "length CRC"), (20, "data CRC"), (-1, "truncated")]
)
def test_tfrecord_corruption_is_reported(tmp_path: Path, damage: int, message: str) -> None:
    fmt, path = get_format("tfrecord"), tmp_path / "s.tfrecord"
    offsets = write(fmt, path, some_samples(3))
    raw = bytearray(path.read_bytes())
    if damage < 0:
        raw = raw[:-5]
    else:
        raw[offsets[1] + damage] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptShardError, match=message) as info:
        fmt.scan(path)
    assert info.value.sample_index == (2 if damage < 0 else 1)
    with pytest.raises(CorruptShardError, match="checksum" if damage >= 0 else "truncated") as info:
        list(fmt.read(path, 0, 3, offsets))  # one sample checksum covers the framing and both CRCs
    assert info.value.sample_index == (None if damage < 0 else 1)
    if damage >= 0:  # a version-1 index (no checksums): the record's own CRCs still catch it
        table = np.delete(offsets.table, CHECKSUM, axis=1)
        with pytest.raises(CorruptShardError, match=message):
            list(fmt.read(path, 0, 3, ShardIndex(table, offsets.fields, version=1)))


def test_tfrecord_example_encoding_matches_protobuf(tmp_path: Path) -> None:
    pytest.importorskip("tfrecord.example_pb2")
    from tfrecord import example_pb2

    path = tmp_path / "one.tfrecord"
    write(get_format("tfrecord"), path, [("k/1", {"png": b"\x00" * 300, "cls": b"3"})])
    example = example_pb2.Example()
    example.ParseFromString(path.read_bytes()[12:-4])  # one record: the Example between the framing
    features = example.features.feature
    assert {name: list(f.bytes_list.value) for name, f in features.items()} == {
        "__key__": [b"k/1"],
        "png": [b"\x00" * 300],
        "cls": [b"3"],
    }


# --- LMDB --------------------------------------------------------------------------------------------


def test_lmdb_grows_its_map_and_stays_compact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lmdb_writer, "_INITIAL_MAP_SIZE", 1 << 16)
    monkeypatch.setattr(lmdb_writer, "_CHUNK_BYTES", 1 << 18)
    samples = some_samples(300, size=8000)
    fmt, path = get_format("lmdb"), tmp_path / "s.lmdb"
    assert list(write(fmt, path, samples)) == list(range(301))
    data_bytes = sum(len(v) for _, fields in samples for v in fields.values())
    assert data_bytes < path.stat().st_size < 1.5 * data_bytes + (1 << 16)
    assert os.listdir(tmp_path) == ["s.lmdb"]
    assert list(fmt.read(path, 290, 300)) == samples[290:]


def test_lmdb_reader_never_crosses_a_fork(tmp_path: Path) -> None:
    fmt, path = get_format("lmdb"), tmp_path / "s.lmdb"
    samples = some_samples(5)
    write(fmt, path, samples)
    reader = fmt.open_reader(path, None)
    assert list(reader.read(0, 1)) == samples[:1]
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            try:
                list(reader.read(1, 2))
                refused = False
            except UsageError:
                refused = True
            with fmt.open_reader(path, None) as own:  # the child's own reader of the same file
                ok = refused and list(own.read(1, 5)) == samples[1:] and fmt.scan(path)[0][4] == samples[4][0]
        except BaseException:
            ok = False
        os.write(write_end, b"1" if ok else b"0")
        os._exit(0)
    os.close(write_end)
    assert os.read(read_end, 1) == b"1"
    os.waitpid(pid, 0)
    assert list(reader.read(4, 5)) == samples[4:]
    reader.close()


def test_lmdb_reads_a_replaced_file(tmp_path: Path) -> None:
    fmt, path = get_format("lmdb"), tmp_path / "s.lmdb"
    write(fmt, path, some_samples(3))
    list(fmt.read(path, 0, 3))
    other = some_samples(4, size=9)
    write(fmt, tmp_path / "new.lmdb", other)
    (tmp_path / "new.lmdb").replace(path)
    assert list(fmt.read(path, 0, 4)) == other


def test_lmdb_scan_checks_count_and_records(tmp_path: Path) -> None:
    import lmdb

    fmt, path = get_format("lmdb"), tmp_path / "s.lmdb"
    write(fmt, path, some_samples(3))
    list(fmt.read(path, 0, 1))  # the reader closed its environment: the file can be opened again
    with lmdb.open(str(path), subdir=False, lock=False) as env, env.begin(write=True) as txn:
        txn.put(lmdb_env.COUNT_KEY, b"4")
    with pytest.raises(CorruptShardError, match="found 3 records"):
        fmt.scan(path)
    with lmdb.open(str(path), subdir=False, lock=False) as env, env.begin(write=True) as txn:
        txn.put(lmdb_env.COUNT_KEY, b"3")
        txn.put(struct.pack(">Q", 1), b"\x02\x00\x00\x00garbage")
    with pytest.raises(CorruptShardError, match="sample 1"):
        fmt.scan(path)
    with pytest.raises(CorruptShardError, match="sample 1"):
        list(fmt.read(path, 0, 3))
    with fmt.open_reader(path) as reader, pytest.raises(CorruptShardError, match="sample 1"):
        reader.read_runs([(2, 3), (0, 2)], ["bin"])


def test_lmdb_read_past_the_end_is_an_error(tmp_path: Path) -> None:
    fmt, path = get_format("lmdb"), tmp_path / "s.lmdb"
    write(fmt, path, some_samples(3))
    with pytest.raises(CorruptShardError, match="sample 3"):
        list(fmt.read(path, 3, 4))
    with pytest.raises(CorruptShardError, match="holds '3'"):
        list(fmt.read(path, 1, 5))


@pytest.mark.parametrize("piece", [1, 3, 256])
def test_lmdb_a_record_longer_than_the_file_is_named_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    """A record whose length runs past the file (a damaged length) is refused by its sample, in whichever
    piece of the walk it lies, before any copy touches it."""
    fmt, path = get_format("lmdb"), tmp_path / "s.lmdb"
    samples = some_samples(12)
    samples[7] = (samples[7][0], {"bin": b"x" * 20_000})
    write(fmt, path, samples)
    monkeypatch.setattr(lmdb_reader, "_PIECE_RECORDS", piece)
    with fmt.open_reader(path) as reader:
        monkeypatch.setattr(reader, "file_size", 10_000)  # as if sample 7's length were damaged
        around = [key_fields for i, key_fields in enumerate(samples) if i != 7]
        assert listed(reader.read_runs([(0, 7), (8, 12)], ["bin"])) == (
            [key for key, _ in around],
            {"bin": [fields["bin"] for _, fields in around]},
        )  # the runs around sample 7 read as written
        for runs in ([(0, 12)], [(2, 5), (6, 9)], [(9, 12), (5, 8)]):
            with pytest.raises(CorruptShardError, match=r"s\.lmdb.*sample 7.*record of 20,"):
                reader.read_runs(runs, ["bin"])
        with pytest.raises(CorruptShardError, match="sample 7"):
            list(reader.read(4, 9))


def test_read_buffer_keeps_what_was_written_when_it_grows() -> None:
    """A buffer filled piece by piece keeps its first ``keep`` bytes when a piece makes it grow, at least
    doubles then, and reuses its memory while it is large enough; a view taken earlier stays valid."""
    buffer = ReadBuffer()
    first = buffer.view(3)
    first[:] = b"abc"
    grown = buffer.view(5, keep=3)
    assert bytes(grown[:3]) == b"abc" and bytes(first) == b"abc"
    grown[3:] = b"de"
    assert len(buffer.view(6)) == 6  # doubled on growing: no new buffer for the next bytes
    again = buffer.view(6, keep=5)
    assert bytes(again[:5]) == b"abcde"
    again[5:] = b"f"
    assert bytes(buffer.view(6)) == b"abcdef" and bytes(grown) == b"abcdef"[:5]


@given(st.binary(max_size=64))
def test_framing_never_crashes_on_garbage(record: bytes) -> None:
    with contextlib.suppress(framing.FramingError):
        framing.decode(record)


@pytest.mark.parametrize("name", ["tar", "tfrecord"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    runs=st.lists(st.tuples(st.integers(0, 24), st.integers(0, 4)), max_size=12),
    damaged=st.one_of(st.none(), st.integers(0, 24)),
)
@example(runs=[(3, 5), (0, 0), (20, 4)], damaged=5)
@example(runs=[(3, 5), (20, 4)], damaged=None)
def test_read_runs_joined_agrees_with_the_chunked_path(
    name: str, runs: list[tuple[int, int]], damaged: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-buffer path of small runs (tar, TFRecord) gives the columns, and names the damaged sample,
    exactly as the run-by-run chunked path does; samples lacking a field included."""
    samples = some_samples(25)
    samples[3] = (samples[3][0], {"bin": b"only bin"})  # lacks 'cls'
    runs = [(start, min(start + count, 25)) for start, count in runs]
    fmt = get_format(name)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"s.{name}"
        index = write(fmt, path, samples)
        if damaged is not None:
            data = bytearray(path.read_bytes())
            data[index[damaged + 1] - 6] ^= 1  # inside sample `damaged`, near its end
            path.write_bytes(bytes(data))
        results = []
        monkeypatch.setattr(joined, "JOINED_MIN_SAMPLES", 1)  # however few samples the runs hold
        for joined_bytes in (JOINED_BYTES, 0):  # the default, then the chunked path only
            monkeypatch.setattr(joined, "JOINED_BYTES", joined_bytes)
            with fmt.open_reader(path, index) as reader:
                try:
                    results.append(listed(reader.read_runs(runs, ["bin", "cls"])))
                except CorruptShardError as exc:
                    results.append(exc.sample_index)
    assert results[0] == results[1]
    wanted = [i for start, stop in runs for i in range(start, stop)]
    if damaged in wanted:
        assert results[0] == damaged
    else:
        keys, fields = results[0]
        assert keys == [samples[i][0] for i in wanted]
        assert fields["cls"] == [samples[i][1].get("cls") for i in wanted]


def damage_sample(fmt: Format, path: Path, index: ShardIndex, sample: int) -> None:
    """Flip one byte inside ``sample``'s record: what only its checksum can notice."""
    if fmt.name == "lmdb":
        import lmdb

        with lmdb.open(str(path), subdir=False, lock=False) as env, env.begin(write=True) as txn:
            key = lmdb_env.INDEX.pack(sample)
            record = bytearray(txn.get(key))
            record[-3] ^= 1
            txn.put(key, bytes(record))
        return
    data = bytearray(path.read_bytes())
    data[index[sample + 1] - 6] ^= 1
    path.write_bytes(bytes(data))


def read_together(
    fmt: Format,
    parts: Sequence[tuple[ShardReader, int, int]],
    names: Sequence[str],
    buffer: ReadBuffer,
    order: np.ndarray | None = None,
) -> ColumnsOut | None:
    """The samples of ``parts`` located together (``Format.locate``) and landed at ``order``; ``None``
    where the format leaves them to be read reader by reader."""
    landing = fmt.locate(parts, names, buffer)
    if landing is None:
        return None
    everything = np.arange(sum(stop - start for _, start, stop in parts))
    return landing.land(everything if order is None else order, BufferPool())


@pytest.mark.parametrize("name", FORMATS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 24), st.integers(0, 6)), max_size=16),
    damaged=st.one_of(st.none(), st.tuples(st.integers(0, 2), st.integers(0, 24))),
    lmdb_path=st.sampled_from(["arrays", "one by one", "views"]),
    piece=st.integers(1, 9),
    shuffle=st.one_of(st.none(), st.integers(0, 1 << 16)),
)
@example(
    parts=[(1, 3, 5), (0, 0, 0), (2, 20, 4), (1, 9, 2)],
    damaged=(2, 21),
    lmdb_path="arrays",
    piece=2,
    shuffle=7,
)
def test_read_across_agrees_with_reading_shard_by_shard(
    name: str,
    parts: list[tuple[int, int, int]],
    damaged: tuple[int, int] | None,
    lmdb_path: str,
    piece: int,
    shuffle: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Runs of several shards read together give the columns of reading each run from its own reader, in
    order, or picked in a shuffled ``order`` (a subset, as a resumed window takes), and a damaged sample
    is named by its shard and position, as its own reader names it. LMDB reads together in each of its
    ways: records joined a ``piece`` at a time and checked as arrays, or one by one, or left as views
    (large records), against one by one in pieces of the default size."""
    fmt = get_format(name)
    monkeypatch.setattr(joined, "JOINED_MIN_SAMPLES", 1)
    monkeypatch.setattr(joined, "JOINED_BYTES", JOINED_BYTES)  # as every example starts
    monkeypatch.setattr(lmdb_reader, "_PIECE_RECORDS", piece)
    monkeypatch.setattr(framing, "_JOIN_MIN_RECORDS", 1 if lmdb_path == "arrays" else 1 << 30)
    monkeypatch.setattr(framing, "_JOIN_BYTES", 0 if lmdb_path == "views" else JOIN_BYTES)
    with tempfile.TemporaryDirectory() as tmp:
        paths, indexes = [], []
        for shard in range(3):
            samples = some_samples(25, size=40 * shard)
            samples[shard] = (samples[shard][0], {"bin": b"no cls"})  # a sample lacking a field
            path = Path(tmp) / f"{shard}{fmt.suffix}"
            indexes.append(write(fmt, path, samples))
            paths.append(path)
        if damaged is not None:
            damage_sample(fmt, paths[damaged[0]], indexes[damaged[0]], damaged[1])
        parts = [(shard, start, min(start + count, 25)) for shard, start, count in parts]
        order = None
        if shuffle is not None:
            rng = np.random.default_rng(shuffle)
            order = rng.permutation(sum(stop - start for _, start, stop in parts))
            order = order[rng.integers(0, len(order) + 1) :]
        readers = [fmt.open_reader(p, i) for p, i in zip(paths, indexes, strict=True)]
        try:
            buffer = ReadBuffer()
            with contextlib.suppress(CorruptShardError):  # leaves other bytes in the buffer
                read_together(fmt, [(reader, 0, 25) for reader in readers], ["bin"], buffer)
            try:
                located = [(readers[shard], start, stop) for shard, start, stop in parts]
                across = listed(read_together(fmt, located, ["bin", "cls"], buffer, order))
            except CorruptShardError as exc:
                across = (exc.shard, exc.sample_index)
            monkeypatch.setattr(joined, "JOINED_BYTES", 0)  # tar, TFRecord: the chunked way
            monkeypatch.setattr(lmdb_reader, "_PIECE_RECORDS", PIECE_RECORDS)
            monkeypatch.setattr(framing, "_JOIN_MIN_RECORDS", 1 << 30)
            monkeypatch.setattr(framing, "_JOIN_BYTES", JOIN_BYTES)
            keys: list[str] = []
            fields: dict[str, list[bytes | None]] = {"bin": [], "cls": []}
            expected: object
            for shard, start, stop in parts:
                try:
                    got_keys, got_fields = listed(readers[shard].read_runs([(start, stop)], ["bin", "cls"]))
                except CorruptShardError as exc:
                    expected = (exc.shard, exc.sample_index)
                    break
                keys += got_keys
                for field in fields:
                    fields[field] += got_fields[field]
            else:
                expected = listed(bytecolumn.in_order((keys, fields), order))
        finally:
            for reader in readers:
                reader.close()
    if not any(stop > start for _, start, stop in parts):
        assert across in (None, expected)  # nothing to read: the caller may be left to do it
    else:
        assert across == expected


def test_joining_leaves_to_the_caller_what_it_cannot_gather_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``None`` for too few samples, too many bytes, shards laid out differently, and a shard read by
    byte ranges; a file shortened under an open reader is named."""
    fmt = get_format("tar")
    monkeypatch.setattr(joined, "JOINED_MIN_SAMPLES", 4)
    both = write(fmt, tmp_path / "both.tar", some_samples(10))
    one = write(fmt, tmp_path / "one.tar", [(f"k{i}", {"bin": b"x"}) for i in range(10)])
    buffer = ReadBuffer()
    with (
        cast(spanreader.SpanReader, fmt.open_reader(tmp_path / "both.tar", both)) as a,
        cast(spanreader.SpanReader, fmt.open_reader(tmp_path / "one.tar", one)) as b,
    ):
        assert joined.join([(a, 0, 3)], ["bin"], buffer) is None
        assert joined.join([(a, 0, 4)], ["bin"], buffer) is not None
        assert joined.join([(a, 0, 2), (b, 0, 2)], ["bin"], buffer) is None
        monkeypatch.setattr(joined, "JOINED_BYTES", both.end - 1)
        assert joined.join([(a, 0, 10)], ["bin"], buffer) is None
        monkeypatch.setattr(joined, "JOINED_BYTES", JOINED_BYTES)
        os.truncate(tmp_path / "both.tar", both[8])
        with pytest.raises(CorruptShardError, match=r"both\.tar.*sample 8"):
            joined.join([(a, 0, 10)], ["bin"], buffer)
    remote = mock.Mock(name="remote", size=both.end)
    remote.name = "s3://bucket/both.tar"
    with cast(spanreader.SpanReader, fmt.open_reader(tmp_path / "both.tar", both, remote=remote)) as r:
        assert joined.join([(r, 0, 10)], ["bin"], buffer) is None


def _decode_each(records: Sequence[bytes], names: Sequence[str]) -> tuple[list[str], dict[str, list]]:
    """What ``decode_many`` must return, record by record; ``RecordError`` at the first bad one (which
    ``decode_many`` names as its sample)."""
    keys: list[str] = []
    fields: dict[str, list[bytes | None]] = {name: [] for name in names}
    for position, record in enumerate(records):
        try:
            key, sample = framing.decode(record)
        except framing.FramingError as exc:
            raise framing.RecordError(str(exc), position=position) from exc
        keys.append(key)
        for name in names:
            fields[name].append(sample.get(name))
    return keys, fields


@pytest.mark.slow
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    _samples,
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=2),
)
def test_framing_decodes_many_records_as_it_decodes_each(
    samples: list[Sample], one_schema: bool, damage: list[tuple[int, int]]
) -> None:
    """Every path (landed as arrays from one buffer or where they lie, or one by one) agrees with
    ``decode`` on every record, damaged ones included: the same columns, or an error naming the same
    record."""
    if one_schema:  # the common case, a shard of one field set: the fast path
        samples = [(key, {"bin": fields.get("bin", b""), "cls": b"1"}) for key, fields in samples]
    records = [bytearray(framing.encode(key, fields)) for key, fields in samples]
    for where, value in damage:
        if records:
            record = records[where % len(records)]
            record[(where // len(records)) % len(record)] = value
    names = ["bin", "cls", "absent"]
    sizes, blob = list(map(len, records)), b"".join(records)
    for fewest, join_bytes in ((1, JOIN_BYTES), (1 << 30, JOIN_BYTES), (1, 0)):
        with (
            mock.patch.object(framing, "_JOIN_MIN_RECORDS", fewest),
            mock.patch.object(framing, "_JOIN_BYTES", join_bytes),
        ):
            for decoded in (
                lambda: framing.decode_many(_views(records), names, _named, version=2, check=True),
                lambda: framing.decode_many(
                    memoryview(blob), names, _named, version=2, check=True, sizes=sizes
                ),
            ):
                try:
                    expected = _decode_each([bytes(r) for r in records], names)
                except framing.RecordError as exc:
                    with pytest.raises(CorruptShardError) as raised:
                        decoded()
                    assert (raised.value.shard, raised.value.sample_index) == ("s", exc.position)
                else:
                    assert listed(decoded()) == expected


def _views(records: Sequence[bytes | bytearray]) -> list[memoryview]:
    return [memoryview(record) for record in records]


def _named(position: int) -> tuple[str, int]:
    return "s", position


@mock.patch.object(framing, "_JOIN_MIN_RECORDS", 1)
def test_framing_decode_many_skips_checksums_when_asked() -> None:
    records = [bytearray(framing.encode(f"k/{i}", {"bin": b"abc"})) for i in range(3)]
    records[1][-9] ^= 1  # the last data byte of record 1
    with pytest.raises(CorruptShardError, match="s, sample 1: sample bytes differ from their checksum"):
        framing.decode_many(_views(records), ["bin"], _named, version=2, check=True)
    keys, fields = listed(framing.decode_many(_views(records), ["bin"], _named, version=2, check=False))
    assert keys == ["k/0", "k/1", "k/2"] and fields["bin"] == [b"abc", b"abb", b"abc"]
    version_1 = _views([bytes(r[:-8]) for r in records])
    assert listed(framing.decode_many(version_1, ["bin"], _named, version=1, check=True)) == (keys, fields)


@mock.patch.object(framing, "_JOIN_MIN_RECORDS", 1)
def test_framing_decode_many_rejects_lengths_that_wrap() -> None:
    """Lengths that add up to the record's size only modulo 2**64, under a valid checksum, are an error."""
    records = [framing.encode(f"k/{i}", {"bin": b"abc"}) for i in range(3)]
    body = bytearray(records[1][:-8])
    struct.pack_into("<QQ", body, 4, 3 + (1 << 63), 3 + (1 << 63))  # key and bin: 6 + 2**64 in all
    records[1] = bytes(body) + struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(body)))
    with pytest.raises(CorruptShardError, match=r"s, sample 1: .*declares"):
        framing.decode_many(_views(records), ["bin"], _named, version=2, check=True)


def test_framing_rejects_a_key_field() -> None:
    with pytest.raises(DataError, match="__key__"):
        framing.encode("k", {"__key__": b"x"})


def test_tar_reads_spans_larger_than_one_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spanreader, "READ_CHUNK", 3000)  # a few samples per read, one sample above it
    samples = [*some_samples(9), ("big/1", {"bin": b"b" * 5000}), *some_samples(3, size=7)[1:]]
    samples[-2:] = [(f"z/{i}", fields) for i, (_, fields) in enumerate(samples[-2:])]
    fmt, path = get_format("tar"), tmp_path / "s.tar"
    offsets = write(fmt, path, samples)
    assert list(fmt.read(path, 0, len(samples), offsets)) == samples
    assert list(fmt.read(path, 8, 11, offsets)) == samples[8:11]
    path.write_bytes(path.read_bytes()[: offsets[10] - 100])
    with pytest.raises(CorruptShardError, match="index ends at"):  # refused before reading a byte
        list(fmt.read(path, 0, len(samples), offsets))


# --- readers and checks -------------------------------------------------------------------------------


def _flip_in_value(path: Path, value: bytes) -> None:
    """Flip one byte in the middle of the first copy of ``value`` in the file."""
    raw = bytearray(path.read_bytes())
    at = raw.index(value) + len(value) // 2
    raw[at] ^= 0x20
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("name", FORMATS)
def test_reader_reads_many_spans_through_one_open_file(tmp_path: Path, name: str) -> None:
    fmt, path = get_format(name), tmp_path / f"s.{name}"
    samples = some_samples(40)
    index = write(fmt, path, samples)
    with fmt.open_reader(path, index if fmt.needs_index else None) as reader:
        got = [sample for start in range(0, 40, 4) for sample in reader.read(start, start + 4)]
        assert got == samples
        assert list(reader.read(7, 7)) == []
        with pytest.raises(CorruptShardError, match="holds"):
            list(reader.read(39, 41))
    with pytest.raises(UsageError, match="closed"):
        list(reader.read(0, 1))
    reader.close()  # idempotent


@pytest.mark.parametrize("name", FORMATS)
def test_a_flipped_sample_byte_is_caught_unless_checks_are_off(tmp_path: Path, name: str) -> None:
    fmt, path = get_format(name), tmp_path / f"s.{name}"
    samples = some_samples(6, size=300)
    written = write(fmt, path, samples)
    index = written if fmt.needs_index else None
    _flip_in_value(path, samples[3][1]["bin"])
    with pytest.raises(CorruptShardError, match="checksum") as info:
        list(fmt.read(path, 0, 6, index))
    assert info.value.sample_index == 3 and info.value.shard == str(path)
    assert list(fmt.read(path, 4, 6, index)) == samples[4:]  # other samples still read
    unchecked = list(fmt.read(path, 0, 6, index, check=False))
    assert unchecked[3] != samples[3] and unchecked[:3] == samples[:3]  # the checks are what caught it


def test_lmdb_readers_share_one_environment_and_unmap_it(tmp_path: Path) -> None:
    import lmdb

    fmt, path = get_format("lmdb"), tmp_path / "s.lmdb"
    samples = some_samples(4)
    write(fmt, path, samples)
    first, second = fmt.open_reader(path, None), fmt.open_reader(path, None)
    first.close()
    assert list(second.read(0, 4)) == samples  # still mapped for the second reader
    with pytest.raises(lmdb.Error, match="already open"):
        lmdb.open(str(path), subdir=False, lock=False, readonly=True)
    del second  # dropped without close(): the last holder unmaps it
    lmdb.open(str(path), subdir=False, lock=False, readonly=True).close()


def test_lmdb_version_1_records_read_without_checksums(tmp_path: Path) -> None:
    record = framing.encode("k/1", {"bin": b"abc", "cls": b"1"})
    assert framing.decode(record) == ("k/1", {"bin": b"abc", "cls": b"1"})
    assert framing.decode(record[:-8], version=1) == ("k/1", {"bin": b"abc", "cls": b"1"})
    damaged = bytearray(record)
    damaged[-12] ^= 1  # inside the data
    with pytest.raises(framing.FramingError, match="checksum"):
        framing.decode(bytes(damaged))
    assert framing.decode(bytes(damaged), check=False)[1]["bin"] == b"`bc"


def test_framing_checks_the_header_before_the_length_it_was_given() -> None:
    record = framing.encode("k/1", {"bin": b"x" * 100})
    with pytest.raises(framing.FramingError, match="declares"):
        framing.decode(record + bytes(1000))  # a longer buffer than the record: rejected, not hashed


@pytest.mark.parametrize("name", ["tar", "tfrecord"])
def test_reader_refuses_a_file_shorter_than_its_index(tmp_path: Path, name: str) -> None:
    fmt, path = get_format(name), tmp_path / f"s.{name}"
    index = write(fmt, path, some_samples(5))
    path.write_bytes(path.read_bytes()[: index[3]])
    with pytest.raises(CorruptShardError, match="index ends at"):
        fmt.open_reader(path, index)
    with pytest.raises(DataError, match="cannot open"):
        fmt.open_reader(tmp_path / "missing", index)


def test_tar_version_1_index_still_checks_headers(tmp_path: Path) -> None:
    fmt, path = get_format("tar"), tmp_path / "s.tar"
    index = write(fmt, path, some_samples(4))
    v1 = ShardIndex(np.delete(index.table, CHECKSUM, axis=1), index.fields, version=1)
    assert list(fmt.read(path, 0, 4, v1)) == some_samples(4)
    raw = bytearray(path.read_bytes())
    raw[index[2] + 3] ^= 1  # in a member name: only the header checksum can tell
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptShardError, match="header checksum") as info:
        list(fmt.read(path, 0, 4, v1))
    assert info.value.sample_index == 2


def test_index_read_checks_sha256_shape_and_spans(tmp_path: Path) -> None:
    import hashlib

    fmt, path = get_format("tar"), tmp_path / "s.tar"
    index = write(fmt, path, some_samples(5))
    idx = tmp_path / "s.tar.idx"
    raw = index.to_bytes()
    idx.write_bytes(raw)
    sha = hashlib.sha256(raw).hexdigest()
    loaded = ShardIndex.read(idx, 5, index.fields, sha256=sha)
    assert loaded == index and loaded.checksums is not None and loaded.num_samples == 5
    with pytest.raises(DataError, match="holds"):
        ShardIndex.read(idx, 6, index.fields)
    with pytest.raises(DataError, match="more than the 336 it may hold"):  # refused unread
        ShardIndex.read(idx, 5, index.fields, version=1)  # one column fewer per row
    table = index.table.copy()
    table[2, index.first_field] = table[3, 0] + 10  # a field starting past its sample
    idx.write_bytes(table.tobytes())
    with pytest.raises(DataError, match=r"does not match its sha256"):
        ShardIndex.read(idx, 5, index.fields, sha256=sha)
    with pytest.raises(DataError, match="sample 2 points outside its sample"):
        ShardIndex.read(idx, 5, index.fields)
    table = index.table.copy()
    table[3, 0], table[4, 0] = table[4, 0], table[3, 0]  # offsets going backwards
    idx.write_bytes(table.tobytes())
    with pytest.raises(DataError, match="sample 3 points outside"):
        ShardIndex.read(idx, 5, index.fields)
    with pytest.raises(DataError, match="cannot read index"):
        ShardIndex.read(tmp_path / "missing.idx", 5, index.fields)
