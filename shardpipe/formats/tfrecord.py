"""TFRecord shards: standard framing with masked CRC32C, one ``tf.train.Example`` per sample.

Each record is ``u64 length, u32 masked crc(length), data, u32 masked crc(data)`` (little-endian), readable
by TensorFlow and the ``tfrecord`` package; the Example is encoded and parsed by :mod:`.tf_example`. Foreign
files are read too: int64 and float lists become ASCII text; a missing ``__key__`` becomes
``{file stem}/{record index:08d}``. With a version-2 index the reader checks each record's sample checksum,
which covers the whole record, instead of the two masked CRCs; those remain for version-1 indexes and
plain offsets.
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
from shardpipe.formats.base import WRITE_BUFFER, Offsets, RemoteBytes
from shardpipe.formats.layout import (
    CHECKSUM,
    KEY_STOP,
    OFFSET,
    SampleLayout,
    ShardIndex,
    fixed_columns,
    span_checksums,
)
from shardpipe.formats.spanreader import SpanFormat, SpanReader
from shardpipe.formats.terms import Column, Fields
from shardpipe.formats.tf_example import KEY_FEATURE, decode_example, entry_head, own_spans, varint

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")


def masked_crc(data: bytes | memoryview) -> int:
    return _mask(crc32c(data))


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


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
    key_head = entry_head(KEY_FEATURE, key_size)
    heads = tuple(entry_head(name, size) for name, size in zip(names, sizes, strict=True))
    body = len(key_head) + key_size + sum(map(len, heads)) + sum(sizes)
    example_head = b"\x0a" + varint(body)  # Example.features and its length
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
        costs a cache lookup, the data CRC chained over its pieces and one checksum of the joined record.
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
        blob = b"".join(parts)  # one write, and the records' checksums over contiguous bytes
        self._file.write(blob)
        sizes = np.fromiter((frame.size for frame in frames), dtype=np.int64, count=len(frames))
        starts = self._position + np.cumsum(sizes) - sizes
        spans = np.array([frame.spans for frame in frames], dtype=np.int64)
        spans += starts[:, None]
        first = fixed_columns(2)
        rows = np.empty((len(keys), first + spans.shape[1] - 3), dtype="<u8")  # a version-2 index's rows
        rows[:, OFFSET : KEY_STOP + 1] = spans[:, :3]  # _Frame.spans: (0, key start, key stop, values...)
        rows[:, CHECKSUM] = span_checksums(
            blob, [*starts.tolist(), self._position + len(blob)], self._position
        )
        rows[:, first:] = spans[:, 3:]
        self._batches.append((ordered_names, rows))
        self._position += int(sizes.sum())

    def close(self) -> ShardIndex:
        self._file.close()
        return ShardIndex.from_batches(self._batches, self._position)


def _records(
    buf: bytes, shard: str, base: int, first_index: int, *, check: bool = True
) -> Iterator[tuple[int, int, int]]:
    """Yield ``(record_offset, data_start, data_end)`` relative to ``buf``, checking the framing and, with
    ``check``, both CRCs."""
    pos, end, index = 0, len(buf), first_index
    while pos < end:
        if pos + 12 > end:
            raise CorruptShardError.at(
                shard, "truncated record header", sample_index=index, offset=base + pos
            )
        length, length_crc = _HEADER.unpack_from(buf, pos)
        if check and masked_crc(buf[pos : pos + 8]) != length_crc:
            raise CorruptShardError.at(shard, "length CRC mismatch", sample_index=index, offset=base + pos)
        data, data_end = pos + 12, pos + 12 + length
        if data_end + 4 > end:
            raise CorruptShardError.at(shard, "truncated record", sample_index=index, offset=base + pos)
        if check and masked_crc(buf[data:data_end]) != _CRC.unpack_from(buf, data_end)[0]:
            raise CorruptShardError.at(shard, "data CRC mismatch", sample_index=index, offset=base + pos)
        yield pos, data, data_end
        pos, index = data_end + 4, index + 1


def _decode(
    buf: bytes, data: int, end: int, shard: str, stem: str, index: int, offset: int
) -> tuple[str, Fields]:
    try:
        return decode_example(buf, data, end, f"{stem}/{index:08d}")
    except (ValueError, IndexError, struct.error) as exc:  # UnicodeDecodeError is a ValueError
        raise CorruptShardError.at(
            shard, f"bad tf.train.Example: {exc}", sample_index=index, offset=offset
        ) from exc


class TfrecordReader(SpanReader):
    """Reads spans of one TFRecord shard through one open file (see :class:`.SpanReader`)."""

    format_name = "TFRecord"

    def _check_chunk_framing(self, view: memoryview, start: int, stop: int, base: int) -> None:
        _check_framing(view, self.index, start, stop, base, self.shard)  # type: ignore[arg-type]

    def _parse_chunk(self, view: memoryview, start: int, count: int, base: int) -> list[tuple[str, Fields]]:
        """Parsed record by record (checking framing and CRCs unless sample checksums were checked)."""
        shard = self.shard
        buf, stem = bytes(view), Path(shard).stem
        out = [
            _decode(buf, data, end, shard, stem, i, base + record)
            for i, (record, data, end) in enumerate(
                _records(buf, shard, base, start, check=self._check_framing), start
            )
        ]
        if len(out) != count:
            detail = f"span holds {len(out)} records, index says {count}"
            raise CorruptShardError.at(shard, detail, sample_index=start, offset=base)
        return out


class TfrecordFormat(SpanFormat, format_name="tfrecord"):
    def open_writer(self, path: Path) -> TfrecordWriter:
        return TfrecordWriter(path)

    def open_reader(
        self, path: Path, index: Offsets | None, *, check: bool = True, remote: RemoteBytes | None = None
    ) -> TfrecordReader:
        return TfrecordReader(path, index, check=check, remote=remote)

    def scan(self, path: Path) -> tuple[list[str], list[SampleLayout], int]:
        shard, stem = str(path), Path(path).stem
        try:
            buf = Path(path).read_bytes()
        except OSError as exc:
            raise DataError(f"cannot read shard {shard}: {exc.strerror}") from exc
        keys: list[str] = []
        layouts: list[SampleLayout] = []
        for record, data, end in _records(buf, shard, 0, 0):
            key, fields = _decode(buf, data, end, shard, stem, len(keys), record)
            spans = own_spans(buf, data, end)
            if spans is None:  # a foreign Example: readers parse it
                layouts.append(SampleLayout(record, None, dict.fromkeys(fields)))
            else:
                key_span = spans.pop(KEY_FEATURE, None)
                layouts.append(SampleLayout(record, key_span, dict(spans)))
            keys.append(key)
        return keys, layouts, len(buf)


def _check_framing(view: memoryview, index: ShardIndex, start: int, stop: int, base: int, shard: str) -> None:
    """Without sample checksums (a version-1 index): check each record's framing and both CRCs."""
    bounds = (index.offsets[start : stop + 1] - base).tolist()
    for i in range(stop - start):
        pos, data_end = bounds[i], bounds[i + 1] - 4
        if data_end < pos + 12:
            raise CorruptShardError.at(shard, "record shorter than its framing", sample_index=start + i)
        if problem := _framing_problem(view, pos, data_end):
            raise CorruptShardError.at(shard, problem, sample_index=start + i, offset=base + pos)


def _framing_problem(view: memoryview, pos: int, data_end: int) -> str | None:
    """What is wrong with the record at ``pos`` whose data ends at ``data_end`` (its data CRC follows), in
    the order a reader finds it; ``None`` when nothing is."""
    length, length_crc = _HEADER.unpack_from(view, pos)
    (data_crc,) = _CRC.unpack_from(view, data_end)
    if masked_crc(view[pos : pos + 8]) != length_crc:
        return "length CRC mismatch"
    if pos + 12 + length != data_end:
        return "record length disagrees with the index"
    if masked_crc(view[pos + 12 : data_end]) != data_crc:
        return "data CRC mismatch"
    return None


FORMAT = TfrecordFormat()
