"""TFRecord shards: standard framing with masked CRC32C, one ``tf.train.Example`` per sample.

Each record is ``u64 length, u32 masked crc(length), data, u32 masked crc(data)`` (little-endian), readable
by TensorFlow and the ``tfrecord`` package. An Example holds ``__key__`` then one single-value bytes_list
feature per field, in sorted order. The protobuf is encoded and parsed here by hand: the generic protobuf
path runs about 25k samples/s, slower than the disk. Foreign files are read too: int64 and float lists
become ASCII text; a missing ``__key__`` becomes ``{file stem}/{record index:08d}``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from crc32c import crc32c

from shardpipe.errors import CorruptShardError, DataError
from shardpipe.formats import WRITE_BUFFER, Column, Fields, Offsets
from shardpipe.formats.layout import SampleLayout, ShardIndex, Span, cut_samples, plain_rows

KEY_FEATURE = "__key__"
_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")
_NAMES: dict[bytes, str] = {}  # decoded feature names: every record repeats the same few


def masked_crc(data: bytes | memoryview) -> int:
    return _mask(crc32c(data))


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


_SMALL_VARINTS = [bytes((i,)) for i in range(0x80)]


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _entry_head(name: str, size: int) -> bytes:
    """A feature map entry up to its value: ``{name, Feature{bytes_list{value}}}`` for a value of ``size``."""
    raw_name = name.encode()
    value_len = _varint(size)
    bytes_list = 1 + len(value_len) + size  # BytesList{value}
    bytes_list_len = _varint(bytes_list)
    feature = 1 + len(bytes_list_len) + bytes_list  # Feature{bytes_list}
    feature_len, name_len = _varint(feature), _varint(len(raw_name))
    entry = 1 + len(name_len) + len(raw_name) + 1 + len(feature_len) + feature  # map entry
    return b"".join(
        (b"\x0a", _varint(entry), b"\x0a", name_len, raw_name, b"\x12", feature_len, b"\x0a",
         bytes_list_len, b"\x0a", value_len)
    )  # fmt: skip


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _messages(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """Yield ``(field_number, wire_type, value_or_start, stop)`` for the fields of ``buf[start:end]``.

    Length-delimited fields give their payload span; varints give ``(value, end)``; fixed ones their span.
    """
    pos = start
    while pos < end:
        tag, pos = _read_varint(buf, pos)
        wire = tag & 7
        if wire == 2:
            length, pos = _read_varint(buf, pos)
            yield tag >> 3, 2, pos, pos + length
            pos += length
        elif wire == 0:
            value, pos = _read_varint(buf, pos)
            yield tag >> 3, 0, value, pos
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            yield tag >> 3, wire, pos, pos + width
            pos += width
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    if pos != end:
        raise ValueError("protobuf field runs past its message")


def _feature_value(buf: bytes, start: int, end: int, name: str) -> bytes:
    """Decode one Feature to bytes: a single bytes value, or int64/float values as ASCII text."""
    for kind, _, kind_start, kind_end in _messages(buf, start, end):
        values = [(w, a, b) for number, w, a, b in _messages(buf, kind_start, kind_end) if number == 1]
        if kind == 1:
            if len(values) != 1 or values[0][0] != 2:
                raise ValueError(f"feature {name!r} holds {len(values)} byte strings; only one is supported")
            return buf[values[0][1] : values[0][2]]
        if kind == 2:
            floats: list[float] = []
            for _, a, b in values:  # packed (wire 2) or one float per field (wire 5)
                floats += struct.unpack(f"<{(b - a) // 4}f", buf[a:b])
            return " ".join(repr(x) for x in floats).encode()
        if kind == 3:
            ints: list[int] = []
            for wire, a, b in values:
                pos = a
                while wire == 2 and pos < b:
                    value, pos = _read_varint(buf, pos)
                    ints.append(value)
                if wire == 0:
                    ints.append(a)
            return " ".join(str(v - (1 << 64) if v >> 63 else v) for v in ints).encode()
    raise ValueError(f"feature {name!r} has no bytes_list, float_list or int64_list")


def _own_spans(buf: bytes, pos: int, end: int) -> dict[str, Span] | None:
    """Where each value of an Example shaped like ours sits (one bytes value per feature); else ``None``.

    Inlines one-byte varints and checks every nested length against its parent's end, so an Example
    that only looks like ours up to some point falls back to the general parser.
    """
    spans: dict[str, Span] = {}
    lengths = [0, 0, 0, 0, 0]
    read_varint = _read_varint
    if end - pos < 2 or buf[pos] != 0x0A:
        return None
    size, pos = read_varint(buf, pos + 1)
    if pos + size != end:
        return None
    while pos < end:
        for level, tag in enumerate(b"\x0a\x0a\x12\x0a\x0a"):  # entry, name, feature, bytes_list, value
            if buf[pos] != tag:
                return None
            size = buf[pos + 1]
            if size < 0x80:
                pos += 2
            else:
                size, pos = read_varint(buf, pos + 1)
            lengths[level] = pos + size
            if level == 1:
                name_end = pos + size
                name = _NAMES.get(buf[pos:name_end]) or _NAMES.setdefault(
                    buf[pos:name_end], buf[pos:name_end].decode()
                )
                pos = name_end
        entry_end = lengths[0]
        if not lengths[2] == lengths[3] == lengths[4] == entry_end <= end:
            return None
        spans[name] = (pos, entry_end)
        pos = entry_end
    return spans


def decode_example(buf: bytes, start: int, end: int, default_key: str) -> tuple[str, Fields]:
    """Parse an Example from ``buf[start:end]``; return ``(key, fields)``."""
    spans = _own_spans(buf, start, end)
    fields = (
        _decode_general(buf, start, end) if spans is None else {n: buf[a:b] for n, (a, b) in spans.items()}
    )
    key = fields.pop(KEY_FEATURE, None)
    return (key.decode() if key is not None else default_key), fields


def _decode_general(buf: bytes, start: int, end: int) -> Fields:
    fields: Fields = {}
    for number, _, features_start, features_end in _messages(buf, start, end):
        if number != 1:
            continue
        for entry_number, _, entry_start, entry_end in _messages(buf, features_start, features_end):
            if entry_number != 1:
                continue
            name, feature = "", (0, 0)
            for part, _, a, b in _messages(buf, entry_start, entry_end):
                if part == 1:
                    name = buf[a:b].decode()
                elif part == 2:
                    feature = (a, b)
            fields[name] = _feature_value(buf, feature[0], feature[1], name)
    return fields


@dataclass(frozen=True, slots=True)
class _Frame:
    """What a record holds around its key and values, for given names and lengths."""

    prefix: bytes
    """Record header (length, its CRC) and the Example up to the key's bytes."""
    prefix_crc: int
    """CRC32C of the prefix's Example part, to chain the data CRC from."""
    heads: tuple[bytes, ...]
    """Each value's feature entry up to the value."""
    spans: tuple[int, ...]
    """``(0, key start, key stop, value start, value stop, ...)`` from the record's start."""
    size: int
    """The whole record's bytes, both CRCs included."""


@lru_cache(maxsize=4096)
def _frame(names: tuple[str, ...], key_size: int, sizes: tuple[int, ...]) -> _Frame:
    key_head = _entry_head(KEY_FEATURE, key_size)
    heads = tuple(_entry_head(name, size) for name, size in zip(names, sizes, strict=True))
    body = len(key_head) + key_size + sum(map(len, heads)) + sum(sizes)
    example_head = b"\x0a" + _varint(body)  # Example.features and its length
    length = _LENGTH.pack(len(example_head) + body)
    prefix = length + _CRC.pack(masked_crc(length)) + example_head + key_head
    spans = [0, len(prefix), len(prefix) + key_size]
    pos = spans[-1]
    for head, size in zip(heads, sizes, strict=True):
        spans += (pos + len(head), pos + len(head) + size)
        pos += len(head) + size
    return _Frame(prefix, crc32c(prefix[12:]), heads, tuple(spans), pos + 4)


class TfrecordWriter:
    def __init__(self, path: Path) -> None:
        self._file = Path(path).open("wb", buffering=WRITE_BUFFER)  # noqa: SIM115 - owned until close()
        self._batches: list[tuple[tuple[str, ...], np.ndarray]] = []
        self._position = 0

    def abort(self) -> None:
        self._file.close()

    def write(self, key: str, fields: Mapping[str, bytes]) -> None:
        self.write_batch([key], list(fields), [[data] for data in fields.values()])

    def write_batch(self, keys: Sequence[str], names: Sequence[str], columns: Sequence[Column]) -> None:
        """Append one record per key; features ``__key__`` then ``names`` in sorted order.

        Everything but the key and values depends only on their lengths (:func:`_frame`), so a record
        costs a cache lookup, the data CRC chained over its pieces (no joined copy) and the writes.
        """
        if KEY_FEATURE in names:
            raise DataError(f"a field is named {KEY_FEATURE!r}, which holds the key")
        if not keys:
            return
        order = sorted(range(len(names)), key=names.__getitem__)
        ordered_names = tuple(names[j] for j in order)
        ordered = [columns[j] for j in order]
        parts: list[bytes | memoryview] = []
        frames: list[_Frame] = []
        for i, key in enumerate(keys):
            raw_key = key.encode()
            values = [column[i] for column in ordered]
            frame = _frame(ordered_names, len(raw_key), tuple(map(len, values)))
            crc = crc32c(raw_key, frame.prefix_crc)
            parts += (frame.prefix, raw_key)
            for head, value in zip(frame.heads, values, strict=True):
                crc = crc32c(value, crc32c(head, crc))
                parts += (head, value)
            parts.append(_CRC.pack(_mask(crc)))
            frames.append(frame)
        self._file.writelines(parts)
        sizes = np.fromiter((frame.size for frame in frames), dtype=np.int64, count=len(frames))
        starts = self._position + np.cumsum(sizes) - sizes
        rows = np.array([frame.spans for frame in frames], dtype=np.int64)
        rows += starts[:, None]
        self._batches.append((ordered_names, rows.astype("<u8")))
        self._position += int(sizes.sum())

    def close(self) -> ShardIndex:
        self._file.close()
        return ShardIndex.from_batches(self._batches, self._position)


def _records(buf: bytes, shard: str, base: int, first_index: int) -> Iterator[tuple[int, int, int]]:
    """Yield ``(record_offset, data_start, data_end)`` relative to ``buf``, checking framing and both CRCs."""
    pos, end, index = 0, len(buf), first_index
    while pos < end:
        if pos + 12 > end:
            raise CorruptShardError(shard, "truncated record header", sample_index=index, offset=base + pos)
        length, length_crc = _HEADER.unpack_from(buf, pos)
        if masked_crc(buf[pos : pos + 8]) != length_crc:
            raise CorruptShardError(shard, "length CRC mismatch", sample_index=index, offset=base + pos)
        data, data_end = pos + 12, pos + 12 + length
        if data_end + 4 > end:
            raise CorruptShardError(shard, "truncated record", sample_index=index, offset=base + pos)
        if masked_crc(buf[data:data_end]) != _CRC.unpack_from(buf, data_end)[0]:
            raise CorruptShardError(shard, "data CRC mismatch", sample_index=index, offset=base + pos)
        yield pos, data, data_end
        pos, index = data_end + 4, index + 1


def _decode(
    buf: bytes, data: int, end: int, shard: str, stem: str, index: int, offset: int
) -> tuple[str, Fields]:
    try:
        return decode_example(buf, data, end, f"{stem}/{index:08d}")
    except (ValueError, IndexError, struct.error) as exc:  # UnicodeDecodeError is a ValueError
        raise CorruptShardError(
            shard, f"bad tf.train.Example: {exc}", sample_index=index, offset=offset
        ) from exc


class TfrecordFormat:
    name = "tfrecord"
    suffix = ".tfrecord"
    needs_index = True

    def open_writer(self, path: Path) -> TfrecordWriter:
        return TfrecordWriter(path)

    def read(
        self, path: Path, start: int, stop: int, offsets: Offsets | None
    ) -> Iterator[tuple[str, Fields]]:
        if offsets is None:
            raise DataError(f"reading TFRecord shard {path} needs its offset index")
        shard, stem, base = str(path), Path(path).stem, int(offsets[start])
        with Path(path).open("rb", buffering=0) as f:
            f.seek(base)
            buf = f.read(int(offsets[stop]) - base)
        if isinstance(offsets, ShardIndex) and len(buf) == int(offsets[stop]) - base:
            sliced = _slice(buf, offsets, start, stop, shard)
            if sliced is not None:
                yield from sliced
                return
        count = 0
        for count, (record, data, end) in enumerate(_records(buf, shard, base, start), 1):
            yield _decode(buf, data, end, shard, stem, start + count - 1, base + record)
        if count != stop - start:
            raise CorruptShardError(
                shard,
                f"span holds {count} records, index says {stop - start}",
                sample_index=start,
                offset=base,
            )

    def scan(self, path: Path) -> tuple[list[str], list[SampleLayout], int]:
        shard, stem = str(path), Path(path).stem
        buf = Path(path).read_bytes()
        keys: list[str] = []
        layouts: list[SampleLayout] = []
        for record, data, end in _records(buf, shard, 0, 0):
            key, fields = _decode(buf, data, end, shard, stem, len(keys), record)
            spans = _own_spans(buf, data, end)
            if spans is None:  # a foreign Example: readers parse it
                layouts.append(SampleLayout(record, None, dict.fromkeys(fields)))
            else:
                key_span = spans.pop(KEY_FEATURE, None)
                layouts.append(SampleLayout(record, key_span, dict(spans)))
            keys.append(key)
        return keys, layouts, len(buf)


def _slice(
    buf: bytes, index: ShardIndex, start: int, stop: int, shard: str
) -> list[tuple[str, Fields]] | None:
    """Records ``[start, stop)`` cut out of ``buf`` by the index after checking their framing and CRCs;
    ``None`` if one needs the parser."""
    rows = plain_rows(index, start, stop, shard)
    if rows is None:
        return None
    base, view = index[start], memoryview(buf)
    bounds = (index.offsets[start : stop + 1] - base).tolist()
    for i in range(stop - start):
        pos, data_end = bounds[i], bounds[i + 1] - 4
        length, length_crc = _HEADER.unpack_from(buf, pos)
        (data_crc,) = _CRC.unpack_from(buf, data_end)
        problem = (
            "length CRC mismatch" if masked_crc(view[pos : pos + 8]) != length_crc
            else "record length disagrees with the index" if pos + 12 + length != data_end
            else "data CRC mismatch" if masked_crc(view[pos + 12 : data_end]) != data_crc
            else None
        )  # fmt: skip
        if problem:
            raise CorruptShardError(shard, problem, sample_index=start + i, offset=base + pos)
    return cut_samples(view, rows, base, index.fields, shard, start)


FORMAT = TfrecordFormat()
