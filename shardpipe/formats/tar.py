"""WebDataset tar shards: one member per field, named ``{key}.{field}``, members of a sample consecutive.

The writer emits fixed ustar headers (mtime 0, uid/gid 0, empty owner names, mode 0o444), so the same
samples give byte-identical shards; names that do not fit a ustar name field, or are not ASCII, get a
deterministic PAX ``path`` header first. The reader parses the 512-byte headers itself from one read of the
span ``[offsets[start], offsets[stop])``: the stdlib ``tarfile`` costs several microseconds per member,
more than the whole read budget of a 1 KiB sample. Header checksums are verified in one numpy pass per span.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain
from pathlib import Path
from typing import cast

import numpy as np

from shardpipe.errors import CorruptShardError, DataError
from shardpipe.formats import WRITE_BUFFER, Column, Fields, Offsets
from shardpipe.formats.layout import (
    NO_SPAN,
    PARSE,
    SampleLayout,
    ShardIndex,
    Span,
    cut_samples,
    plain_rows,
)

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
_MAX_USTAR_SIZE = 8**11
_READ_CHUNK = 1 << 23
# name, size, typeflag: with the ustar prefix, the only header fields a reader of sample shards needs.
_HEADER = struct.Struct("100s24x12s20xc")
_REGULAR = {b"0", b"\0", b"7"}
_SKIPPED = {b"5", b"g"}  # directories and global PAX headers carry no sample data
_ZERO_BLOCK = bytes(BLOCK)
_FIELD_NAMES: dict[bytes, str] = {}  # decoded field names: a shard repeats the same few


# A header is the name, this fixed middle (mode, uid, gid), the size, mtime, the checksum, the type flag
# and this fixed tail (ustar magic, empty owner names, devmajor/minor). The checksum (sum of the header's
# bytes with its own field as spaces) is the fixed parts' sum plus the variable ones': building the block
# with one format and summing only the short variable parts is ~3x faster than summing 512 bytes.
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
        per member cost ~5 us of a 1 KiB sample's ~12); only PAX names are built one by one."""
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
        self._file.writelines(chain.from_iterable(zip(prefixes, values, pads, strict=True)))

        # (members,) -> (samples, fields): where each member and its data start
        lengths = prefix_lengths + sizes + (-sizes % BLOCK)
        starts = self._position + np.cumsum(lengths) - lengths
        data_starts = (starts + prefix_lengths).reshape(len(keys), len(order))
        rows = np.empty((len(keys), 3 + 2 * len(order)), dtype="<u8")
        rows[:, 0] = starts[:: len(order)]
        rows[:, 1] = rows[:, 0]  # the key opens the first header's name field
        rows[:, 2] = rows[:, 0] + np.fromiter(map(len, raw_keys), dtype=np.int64, count=len(keys))
        rows[:, 3::2] = data_starts
        rows[:, 4::2] = data_starts + sizes.reshape(len(keys), len(order))
        pax_samples = (prefix_lengths != BLOCK).reshape(len(keys), len(order)).any(axis=1)
        rows[pax_samples, 1:3] = PARSE  # a PAX name: the index marks the sample for parsing
        rows[pax_samples, 3:] = NO_SPAN
        self._batches.append((tuple(names[j] for j in order), rows))
        self._position = int(starts[-1] + lengths[-1])

    def close(self) -> ShardIndex:
        self._file.write(END_OF_ARCHIVE)
        self._file.close()
        return ShardIndex.from_batches(self._batches, self._position)


Sample = tuple[str, Fields, SampleLayout]
"""``(key, fields, layout)``; the layout's positions are relative to the parsed buffer."""


def _parse(
    buf: memoryview, shard: str, base: int, first_index: int, *, until_end_marker: bool
) -> tuple[list[Sample], int]:
    """Parse ``buf`` (starting at a header) into samples; also return where parsing stopped.

    Consecutive members sharing a key form one sample. Offsets are relative to ``buf``; ``base`` is
    ``buf``'s position in the file, for error messages. Parsing stops at the end-of-archive marker when
    ``until_end_marker``, else exactly at ``len(buf)``. Header checksums are checked before returning.
    """
    samples: list[Sample] = []
    headers: list[int] = []
    end, pos = len(buf), 0
    key_bytes, fields, spans = b"", cast(Fields, {}), cast(dict[str, Span | None], {})
    chain: int | None = None  # offset of the extended header that started the current member
    long_name: bytes | None = None
    pax_size: int | None = None
    unpack, field_names = _HEADER.unpack_from, _FIELD_NAMES
    try:
        while pos < end or until_end_marker:
            if pos + BLOCK > end:
                raise _BadHeaderError("truncated tar header (no end-of-archive marker)", pos)
            raw_name, raw_size, typeflag = unpack(buf, pos)
            if not raw_name[0] and buf[pos : pos + BLOCK] == _ZERO_BLOCK:
                if until_end_marker:
                    break
                raise _BadHeaderError("end-of-archive marker inside a sample span", pos)
            headers.append(pos)
            plain = raw_size[11] in (0, 32) and raw_size[0] < 0x80  # "%011o" then NUL or space
            size = int(raw_size[:11], 8) if plain else _size(raw_size)
            if pax_size is not None:
                size, pax_size = pax_size, None
            data = pos + BLOCK
            following = data + size + (-size % BLOCK)
            if following > end:
                raise _BadHeaderError(f"member data truncated ({size} bytes declared)", pos)
            if typeflag in _REGULAR:
                in_header = long_name is None  # the key's bytes sit at the start of this header
                if in_header:
                    name = raw_name.partition(b"\0")[0]
                    if buf[pos + 345] and bytes(buf[pos + 257 : pos + 263]) == b"ustar\0":  # name prefix
                        name = bytes(buf[pos + 345 : pos + 500]).partition(b"\0")[0] + b"/" + name
                        in_header = False
                else:
                    name, long_name = long_name, None
                slash = name.rfind(b"/")
                dot = name.find(b".", slash + 1)
                if dot <= slash + 1 or dot == len(name) - 1:
                    raise _BadHeaderError(f"member {name!r} is not named '<key>.<field>'", pos)
                if name[:dot] != key_bytes:
                    key_bytes, fields, spans = name[:dot], {}, {}
                    key_span = (pos, pos + dot) if in_header else None
                    layout = SampleLayout(pos if chain is None else chain, key_span, spans)
                    samples.append((key_bytes.decode(), fields, layout))
                field = field_names.get(name[dot + 1 :]) or _field_name(name[dot + 1 :])
                if field in fields:
                    raise _BadHeaderError(f"duplicate member {name!r}", pos)
                fields[field] = buf[data : data + size].tobytes()
                spans[field] = (data, data + size)
                chain = None
            elif typeflag in b"xLK":
                chain = pos if chain is None else chain
                if typeflag == b"x":
                    for keyword, value in _pax_records(bytes(buf[data : data + size]), pos):
                        if keyword == b"path":
                            long_name = value
                        elif keyword == b"size":
                            pax_size = int(value)
                elif typeflag == b"L":
                    long_name = bytes(buf[data : data + size]).rstrip(b"\0")
            elif typeflag in _SKIPPED:
                chain = long_name = None
            else:
                raise _BadHeaderError(f"unsupported tar member type {typeflag!r}", pos)
            pos = following
        if chain is not None:
            raise _BadHeaderError("extended header without a following member", chain)
    except (
        _BadHeaderError,
        ValueError,
    ) as exc:  # a bad checksum explains a garbled header best: check those first
        _verify_checksums(buf, [h for h in headers if h + BLOCK <= end], shard, base)
        at, detail = (
            (exc.pos, str(exc)) if isinstance(exc, _BadHeaderError) else (pos, f"malformed header: {exc}")
        )
        index = first_index + max(len(samples) - 1, 0)  # the sample the bad bytes belong to or follow
        raise CorruptShardError(shard, detail, sample_index=index, offset=base + at) from None
    _verify_checksums(buf, headers, shard, base)
    return samples, pos


class _BadHeaderError(Exception):
    def __init__(self, detail: str, pos: int) -> None:
        super().__init__(detail)
        self.pos = pos


def _size(raw: bytes) -> int:
    if raw[0] == 0x80:  # base-256, as GNU tar writes sizes of 8 GiB and more
        return int.from_bytes(raw[1:], "big")
    return int(raw.strip(b"\0 ") or b"0", 8)


def _field_name(raw: bytes) -> str:
    name = raw.decode()
    if len(_FIELD_NAMES) < 1024:
        _FIELD_NAMES[raw] = name
    return name


def _pax_records(data: bytes, pos: int) -> Iterator[tuple[bytes, bytes]]:
    """Yield ``(keyword, value)`` of a PAX header's ``"<length> <keyword>=<value>\\n"`` records."""
    start = 0
    while start < len(data) and data[start] != 0:
        space = data.find(b" ", start)
        length = int(data[start:space])
        if length <= 0:
            raise _BadHeaderError("malformed PAX header", pos)
        keyword, _, value = data[space + 1 : start + length - 1].partition(b"=")
        start += length
        yield keyword, value


_LANES = np.uint64(0x00FF00FF00FF00FF)
_OCTAL_PLACES = 8 ** np.arange(5, -1, -1, dtype=np.int64)


def _verify_checksums(buf: memoryview, headers: list[int], shard: str, base: int) -> None:
    """Check every header's checksum in one vectorised pass; fall back to Python for odd encodings.

    Bytes are summed eight at a time in four 16-bit lanes (64 words x 2 x 255 cannot overflow a lane),
    several times cheaper than widening every byte. The common ``"%06o\\0 "`` field is parsed in numpy too.
    """
    if not headers:
        return
    blocks = np.frombuffer(buf, np.uint8, count=len(buf) // BLOCK * BLOCK).reshape(-1, BLOCK)
    rows = blocks[np.asarray(headers, dtype=np.intp) // BLOCK]  # (headers, 512), a copy
    field = rows[:, 148:155].astype(np.int64)
    rows[:, 148:156] = ord(" ")  # the checksum is computed with its own field read as spaces
    words = rows.view("<u8")  # (headers, 64)
    high = words >> np.uint64(8)
    high &= _LANES
    words &= _LANES
    words += high
    lanes = words.sum(axis=1)  # (headers,): four 16-bit partial sums each
    computed = (lanes & 0xFFFF) + ((lanes >> 16) & 0xFFFF) + ((lanes >> 32) & 0xFFFF) + (lanes >> 48)
    digits = field[:, :6] - ord("0")
    plain = ((digits >= 0) & (digits < 8)).all(axis=1) & (field[:, 6] == 0)
    ok = plain & (digits @ _OCTAL_PLACES == computed.astype(np.int64))
    for row in np.flatnonzero(~ok):
        pos = headers[row]
        block = bytes(buf[pos : pos + BLOCK])
        unsigned = sum(block[:148]) + 256 + sum(block[156:])
        signed = unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b >= 128)
        try:
            value = int(block[148:156].strip(b"\0 "), 8)
        except ValueError:
            value = -1
        if value not in (unsigned, signed):
            raise CorruptShardError(shard, "tar header checksum mismatch", offset=base + pos)


class TarFormat:
    name = "tar"
    suffix = ".tar"
    needs_index = True

    def open_writer(self, path: Path) -> TarWriter:
        return TarWriter(path)

    def read(
        self, path: Path, start: int, stop: int, offsets: Offsets | None
    ) -> Iterator[tuple[str, Fields]]:
        if offsets is None:
            raise DataError(f"reading tar shard {path} needs its offset index")
        shard, index = str(path), start
        with Path(path).open("rb", buffering=0) as f:
            buffer = bytearray(min(_READ_CHUNK, int(offsets[stop]) - int(offsets[start])))
            while index < stop:
                # Whole samples up to _READ_CHUNK bytes per read, into one reused buffer: a fresh
                # buffer per span costs a page fault per 4 KiB, which halves the rate for 64 KiB samples.
                base = int(offsets[index])
                chunk_stop = max(
                    index + 1, bisect_right(offsets, base + _READ_CHUNK, index + 1, stop + 1) - 1
                )
                size = int(offsets[chunk_stop]) - base
                if size > len(buffer):
                    buffer = bytearray(size)
                view = memoryview(buffer)[:size]
                f.seek(base)
                if f.readinto(view) != size:
                    raise CorruptShardError(
                        shard, "file ends inside the span", sample_index=index, offset=base
                    )
                try:
                    yield from _read_chunk(view, offsets, index, chunk_stop, shard, base)
                except CorruptShardError as exc:
                    if exc.sample_index is not None or exc.offset is None:
                        raise
                    at = bisect_right(offsets, exc.offset, index, stop + 1) - 1  # the sample holding the byte
                    raise CorruptShardError(shard, exc.detail, sample_index=at, offset=exc.offset) from exc
                index = chunk_stop

    def scan(self, path: Path) -> tuple[list[str], list[SampleLayout], int]:
        shard = str(path)
        samples, end = _parse(memoryview(Path(path).read_bytes()), shard, 0, 0, until_end_marker=True)
        keys = [key for key, _, _ in samples]
        if len(set(keys)) != len(keys):
            index = next(i for i, key in enumerate(keys) if key in keys[:i])
            detail = f"key {keys[index]!r} appears twice: members of a sample must be consecutive"
            raise CorruptShardError(shard, detail, sample_index=index, offset=samples[index][2].offset)
        return keys, [layout for _, _, layout in samples], end


def _read_chunk(
    view: memoryview, offsets: Offsets, start: int, stop: int, shard: str, base: int
) -> list[tuple[str, Fields]]:
    """Samples ``[start, stop)`` of a chunk read at ``base``: sliced by the index, or parsed."""
    if isinstance(offsets, ShardIndex) and (sliced := _slice(view, offsets, start, stop, shard)) is not None:
        return sliced
    samples, _ = _parse(view, shard, base, start, until_end_marker=False)
    if len(samples) != stop - start:
        detail = f"span holds {len(samples)} samples, the index says {stop - start}"
        raise CorruptShardError(shard, detail, sample_index=start, offset=base)
    return [(key, fields) for key, fields, _ in samples]


def _slice(
    view: memoryview, index: ShardIndex, start: int, stop: int, shard: str
) -> list[tuple[str, Fields]] | None:
    """Samples ``[start, stop)`` cut out of ``view`` by the index; ``None`` if one needs the parser.

    Every member header sits right before its data: their checksums are still verified before slicing.
    """
    rows = plain_rows(index, start, stop, shard, header=BLOCK)
    if rows is None:
        return None
    base = index[start]
    data_starts = rows[:, 3::2][rows[:, 3::2] != NO_SPAN]
    _verify_checksums(view, (data_starts - (base + BLOCK)).tolist(), shard, base)
    return cut_samples(view, rows, base, index.fields, shard, start)


FORMAT = TarFormat()
