"""WebDataset tar shards: one member per field, named ``{key}.{field}``, members of a sample consecutive.

The writer emits fixed ustar headers (mtime 0, uid/gid 0, empty owner names, mode 0o444), so the same
samples give byte-identical shards; names that do not fit a ustar name field, or are not ASCII, get a
deterministic PAX ``path`` header first. The reader slices samples out of one read of a span by the index
and checks each sample's checksum (which covers its headers); parsing (:mod:`.tarparse`) is the fallback
for foreign names and plain offsets, and version-1 indexes fall back to checking header checksums.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain
from pathlib import Path

import numpy as np

from shardpipe.errors import CorruptShardError, DataError
from shardpipe.formats.base import WRITE_BUFFER, Offsets, RemoteBytes
from shardpipe.formats.layout import (
    CHECKSUM,
    KEY_START,
    KEY_STOP,
    NO_SPAN,
    OFFSET,
    PARSE,
    SampleLayout,
    ShardIndex,
    fixed_columns,
    span_checksums,
)
from shardpipe.formats.spanreader import SpanFormat, SpanReader
from shardpipe.formats.tarparse import BLOCK, parse, verify_checksums
from shardpipe.formats.terms import Column, Fields

END_OF_ARCHIVE = bytes(2 * BLOCK)
_MAX_USTAR_SIZE = 8**11


# A header is the name, this fixed middle (mode, uid, gid), the size, mtime, the checksum, the type flag
# and this fixed tail (ustar magic, empty owner names, devmajor/minor). The checksum (sum of the header's
# bytes with its own field as spaces) is the fixed parts' sum plus the variable ones': cheaper than summing
# the 512 bytes of every block.
_MIDDLE = b"0000444\x000000000\x000000000\x00"
_MTIME = b"00000000000\x00"
_TAIL = bytes(100) + b"ustar\x0000" + bytes(64) + b"0000000\x000000000\x00" + bytes(167)
_FIXED_SUM = sum(_MIDDLE) + sum(_MTIME) + 8 * 32 + sum(_TAIL)


_OCTAL_SHIFTS = np.arange(10, -1, -1, dtype=np.int64) * 3  # most significant octal digit first


def _header(name: bytes, size: int, typeflag: bytes) -> bytes:
    if size >= _MAX_USTAR_SIZE:
        raise DataError(
            f"tar member {name!r} is {size} bytes; ustar shards hold at most {_MAX_USTAR_SIZE - 1}"
        )
    size_field = b"%011o\x00" % size
    checksum = _FIXED_SUM + sum(name) + sum(size_field) + typeflag[0]
    block = b"%s%s%s%s%06o\x00 %s%s" % (
        name.ljust(100, b"\0"),
        _MIDDLE,
        size_field,
        _MTIME,
        checksum,
        typeflag,
        _TAIL,
    )
    return block


_TEMPLATE = np.frombuffer(_header(b"", 0, b"0"), dtype=np.uint8).copy()
_TEMPLATE[124:135] = 0  # size digits: written per member
_TEMPLATE[148:156] = ord(" ")  # the checksum field counts as spaces while summing
_TEMPLATE_SUM = int(_TEMPLATE.sum())


def _headers(names: list[bytes], sizes: np.ndarray) -> bytes:
    """``_header(name[:100], size, b"0")`` for every member at once: the fixed fields from one template,
    name and size written as columns, the checksum as the template's sum plus theirs."""
    if len(sizes) and sizes.max() >= _MAX_USTAR_SIZE:
        big = int(np.argmax(sizes))
        _header(names[big], int(sizes[big]), b"0")  # raises, naming the member
    name_bytes = np.array(names, dtype="S100").view(np.uint8).reshape(len(names), 100)
    size_digits = (sizes[:, None] >> _OCTAL_SHIFTS[-11:]) % 8 + ord("0")
    checksums = _TEMPLATE_SUM + name_bytes.sum(axis=1, dtype=np.int64) + size_digits.sum(axis=1)
    blocks = np.empty((len(names), BLOCK), dtype=np.uint8)
    blocks[:] = _TEMPLATE
    blocks[:, :100] = name_bytes
    blocks[:, 124:135] = size_digits
    blocks[:, 148:154] = (checksums[:, None] >> _OCTAL_SHIFTS[-6:]) % 8 + ord("0")
    blocks[:, 154] = 0
    return blocks.tobytes()


def _pax_record(keyword: bytes, value: bytes) -> bytes:
    """One ``"<len> <keyword>=<value>\\n"`` record; ``len`` counts its own digits."""
    body = b" " + keyword + b"=" + value + b"\n"
    length = len(body) + len(str(len(body)))
    length = len(body) + len(str(length))
    return b"%d" % length + body


_PADDING = [bytes(-size % BLOCK) for size in range(BLOCK)]  # by size % BLOCK


def check_key(key: str) -> None:
    """Reject keys that webdataset would split into a different key and field."""
    base = key.rpartition("/")[2]
    if not base or "." in base or "\0" in key:
        raise DataError(
            f"sample key {key!r} breaks the webdataset naming rule: its last path component must be "
            "non-empty and hold no '.'"
        )


def check_field(field: str) -> None:
    if not field or "/" in field or "\0" in field:
        raise DataError(
            f"field {field!r} breaks the webdataset naming rule: it must be non-empty without '/'"
        )


class TarWriter:
    """Appends samples to one shard; ``close()`` returns the shard's index."""

    def __init__(self, path: Path) -> None:
        self._file = Path(path).open("wb", buffering=WRITE_BUFFER)  # noqa: SIM115 - owned until close()
        self._batches: list[tuple[tuple[str, ...], np.ndarray]] = []
        self._position = 0

    def abort(self) -> None:
        self._file.close()

    def write(self, key: str, fields: Mapping[str, bytes]) -> None:
        if not fields:
            raise DataError(f"sample {key!r} has no fields; a tar shard cannot hold it")
        self.write_batch([key], list(fields), [[data] for data in fields.values()])

    def write_batch(self, keys: Sequence[str], names: Sequence[str], columns: Sequence[Column]) -> None:
        """Append samples ``keys[i]`` with fields ``names[j] = columns[j][i]``, as members in sorted
        field order. Headers and positions are computed for the whole batch with numpy (a header built
        per member costs a large part of a small sample's time); only PAX names are built one by one."""
        if not keys:
            return
        if not names:
            raise DataError(f"sample {keys[0]!r} has no fields; a tar shard cannot hold it")
        order = sorted(range(len(names)), key=names.__getitem__)
        for j in order:
            check_field(names[j])
        for key in keys:
            check_key(key)
        raw_keys = [key.encode() for key in keys]
        suffixes = [f".{names[j]}".encode() for j in order]
        ordered = [columns[j] for j in order]
        member_names = [raw_key + suffix for raw_key in raw_keys for suffix in suffixes]  # sample-major
        values = [column[i] for i in range(len(keys)) for column in ordered]
        sizes = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
        headers = memoryview(_headers(member_names, sizes))
        prefixes: list[bytes | memoryview] = [headers[k : k + BLOCK] for k in range(0, len(headers), BLOCK)]
        prefix_lengths = np.full(len(values), BLOCK, dtype=np.int64)
        for k, name in enumerate(member_names):
            if len(name) > 100 or not name.isascii():  # PAX path header first; ustar keeps name[:100]
                record = _pax_record(b"path", name)
                pax = _header(b"././@PaxHeader", len(record), b"x") + record + _PADDING[len(record) % BLOCK]
                prefixes[k] = pax + prefixes[k]
                prefix_lengths[k] += len(pax)
        pads = [_PADDING[size % BLOCK] for size in sizes.tolist()]
        # One joined write: the file buffer would copy these pieces anyway, and the samples' checksums
        # are then taken over contiguous bytes.
        blob = b"".join(chain.from_iterable(zip(prefixes, values, pads, strict=True)))
        self._file.write(blob)

        # (members,) -> (samples, fields): where each member and its data start
        lengths = prefix_lengths + sizes + (-sizes % BLOCK)
        starts = self._position + np.cumsum(lengths) - lengths
        data_starts = (starts + prefix_lengths).reshape(len(keys), len(order))
        first = fixed_columns(2)
        rows = np.empty((len(keys), first + 2 * len(order)), dtype="<u8")  # a version-2 index's rows
        rows[:, OFFSET] = starts[:: len(order)]
        rows[:, KEY_START] = rows[:, OFFSET]  # the key opens the first header's name field
        rows[:, KEY_STOP] = rows[:, OFFSET] + np.fromiter(map(len, raw_keys), dtype=np.int64, count=len(keys))
        rows[:, CHECKSUM] = span_checksums(
            blob, [*rows[:, OFFSET].tolist(), self._position + len(blob)], self._position
        )
        rows[:, first::2] = data_starts
        rows[:, first + 1 :: 2] = data_starts + sizes.reshape(len(keys), len(order))
        pax_samples = (prefix_lengths != BLOCK).reshape(len(keys), len(order)).any(axis=1)
        rows[pax_samples, KEY_START : KEY_STOP + 1] = (
            PARSE  # a PAX name: the index marks the sample for parsing
        )
        rows[pax_samples, first:] = NO_SPAN
        self._batches.append((tuple(names[j] for j in order), rows))
        self._position = int(starts[-1] + lengths[-1])

    def close(self) -> ShardIndex:
        self._file.write(END_OF_ARCHIVE)
        self._file.close()
        return ShardIndex.from_batches(self._batches, self._position)


class TarReader(SpanReader):
    """Reads spans of one tar shard through one open file (see :class:`.SpanReader`)."""

    format_name = "tar"

    def _check_chunk_framing(self, view: memoryview, start: int, stop: int, base: int) -> None:
        _check_member_headers(view, self.index, start, stop, base, self.shard)  # type: ignore[arg-type]

    def _parse_chunk(self, view: memoryview, start: int, count: int, base: int) -> list[tuple[str, Fields]]:
        """Parsed header by header (checking each header unless sample checksums were checked)."""
        shard = self.shard
        samples, _ = parse(
            view, shard, base, start, until_end_marker=False, check_headers=self._check_framing
        )
        if len(samples) != count:
            detail = f"span holds {len(samples)} samples, the index says {count}"
            raise CorruptShardError.at(shard, detail, sample_index=start, offset=base)
        return [(key, fields) for key, fields, _ in samples]


def _check_member_headers(
    view: memoryview, index: ShardIndex, start: int, stop: int, base: int, shard: str
) -> None:
    """Without sample checksums (a version-1 index), check the header before every member's data."""
    data_starts = index.field_starts[start:stop]  # (samples, fields)
    present = data_starts != NO_SPAN
    headers = data_starts - np.uint64(BLOCK)  # wraps below zero: caught by the first test
    if (present & ((data_starts < BLOCK) | (headers < index.offsets[start:stop, None]))).any():
        raise CorruptShardError.at(
            shard, "the index puts a member's data before its header", sample_index=start
        )
    verify_checksums(view, (headers[present] - base).tolist(), shard, base)


class TarFormat(SpanFormat, format_name="tar"):
    def open_writer(self, path: Path) -> TarWriter:
        return TarWriter(path)

    def open_reader(
        self, path: Path, index: Offsets | None, *, check: bool = True, remote: RemoteBytes | None = None
    ) -> TarReader:
        return TarReader(path, index, check=check, remote=remote)

    def scan(self, path: Path) -> tuple[list[str], list[SampleLayout], int]:
        shard = str(path)
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise DataError(f"cannot read shard {shard}: {exc.strerror}") from exc
        samples, end = parse(memoryview(data), shard, 0, 0, until_end_marker=True)
        keys = [key for key, _, _ in samples]
        if len(set(keys)) != len(keys):
            index = next(i for i, key in enumerate(keys) if key in keys[:i])
            detail = f"key {keys[index]!r} appears twice: members of a sample must be consecutive"
            raise CorruptShardError.at(shard, detail, sample_index=index, offset=samples[index][2].offset)
        return keys, [layout for _, _, layout in samples], end


FORMAT = TarFormat()
