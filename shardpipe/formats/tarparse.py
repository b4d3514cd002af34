"""Parse tar bytes into samples, in three small chained steps.

1. :func:`walk_headers` steps from header to header and yields each member's header fields;
2. :func:`resolve_names` folds extended headers (PAX ``path``, GNU long names, the ustar prefix) into the
   member that follows them and yields regular members with their full names;
3. :func:`group_samples` groups consecutive members sharing a key into ``(key, fields, layout)``.

:func:`parse` chains them, checks the header checksums of what it walked, and turns every failure into a
:class:`~shardpipe.errors.CorruptShardError` naming the shard, the sample and the byte. This is the
readers' fallback (foreign names, plain offsets, version-1 indexes) and the scan behind ``index`` and
``verify``; shards shardpipe wrote are sliced by their index instead.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np

from shardpipe.errors import CorruptShardError
from shardpipe.formats.layout import SampleLayout
from shardpipe.formats.terms import Fields, Span

BLOCK = 512
# name, size, typeflag: with the ustar prefix, the only header fields a reader of sample shards needs.
_HEADER = struct.Struct("100s24x12s20xc")
_REGULAR = {b"0", b"\0", b"7"}
_SKIPPED = {b"5", b"g"}  # directories and global PAX headers carry no sample data
_ZERO_BLOCK = bytes(BLOCK)
_FIELD_NAMES: dict[bytes, str] = {}  # decoded field names: a shard repeats the same few

Sample = tuple[str, Fields, SampleLayout]
"""``(key, fields, layout)``; the layout's positions are relative to the parsed buffer."""
Header = tuple[int, bytes, int, bytes]
"""``(position, raw 100-byte name field, data size, type flag)`` of one member."""
Member = tuple[int, int, bytes, bool, int, int]
"""``(sample-relevant start, header position, full name, name in this header, data start, size)``."""


class BadHeaderError(Exception):
    def __init__(self, detail: str, pos: int) -> None:
        super().__init__(detail)
        self.pos = pos


class Walk:
    """What :func:`walk_headers` saw: header positions (for their checksums) and where it stopped."""

    __slots__ = ("headers", "stop")

    def __init__(self) -> None:
        self.headers: list[int] = []
        self.stop = 0


def walk_headers(buf: memoryview, walk: Walk, *, until_end_marker: bool) -> Iterator[Header]:
    """Yield every member header of ``buf``, recording positions in ``walk``.

    Stops at the end-of-archive marker when ``until_end_marker``, else exactly at ``len(buf)`` (a marker
    before that is an error). A PAX ``size`` record overrides the next member's size here, as it decides
    where the next header sits.
    """
    end, pos = len(buf), 0
    pax_size: int | None = None
    unpack = _HEADER.unpack_from
    while pos < end or until_end_marker:
        if pos + BLOCK > end:
            raise BadHeaderError("truncated tar header (no end-of-archive marker)", pos)
        raw_name, raw_size, typeflag = unpack(buf, pos)
        if not raw_name[0] and buf[pos : pos + BLOCK] == _ZERO_BLOCK:
            if until_end_marker:
                walk.stop = pos
                return
            raise BadHeaderError("end-of-archive marker inside a sample span", pos)
        walk.headers.append(pos)
        plain = raw_size[11] in (0, 32) and raw_size[0] < 0x80  # "%011o" then NUL or space
        size = int(raw_size[:11], 8) if plain else _size(raw_size)
        if pax_size is not None:
            size, pax_size = pax_size, None
        if size < 0:
            raise BadHeaderError(f"negative member size {size}", pos)
        following = pos + BLOCK + size + (-size % BLOCK)
        if following > end:
            raise BadHeaderError(f"member data truncated ({size} bytes declared)", pos)
        if typeflag == b"x":
            for keyword, value in pax_records(bytes(buf[pos + BLOCK : pos + BLOCK + size]), pos):
                if keyword == b"size":
                    pax_size = int(value)
        yield pos, raw_name, size, typeflag
        pos = following
    walk.stop = pos


def resolve_names(buf: memoryview, headers: Iterator[Header]) -> Iterator[Member]:
    """Yield regular members with their full names, extended headers folded into the member after them."""
    chain: int | None = None  # position of the extended header that started the current member
    long_name: bytes | None = None
    for pos, raw_name, size, typeflag in headers:
        data = pos + BLOCK
        if typeflag in _REGULAR:
            in_header = long_name is None  # the key's bytes sit at the start of this header
            if in_header:
                name = raw_name.partition(b"\0")[0]
                if buf[pos + 345] and bytes(buf[pos + 257 : pos + 263]) == b"ustar\0":  # name prefix
                    name = bytes(buf[pos + 345 : pos + 500]).partition(b"\0")[0] + b"/" + name
                    in_header = False
            else:
                name, long_name = long_name, None  # type: ignore[assignment]
            yield (pos if chain is None else chain), pos, name, in_header, data, size
            chain = None
        elif typeflag in b"xLK":
            chain = pos if chain is None else chain
            if typeflag == b"x":
                for keyword, value in pax_records(bytes(buf[data : data + size]), pos):
                    if keyword == b"path":
                        long_name = value
            elif typeflag == b"L":
                long_name = bytes(buf[data : data + size]).rstrip(b"\0")
        elif typeflag in _SKIPPED:
            chain = long_name = None
        else:
            raise BadHeaderError(f"unsupported tar member type {typeflag!r}", pos)
    if chain is not None:
        raise BadHeaderError("extended header without a following member", chain)


def group_samples(buf: memoryview, members: Iterator[Member]) -> Iterator[Sample]:
    """Yield each run of consecutive members sharing a key as one sample, once the run is complete."""
    current: Sample | None = None
    field_names = _FIELD_NAMES
    for start, pos, name, in_header, data, size in members:
        slash = name.rfind(b"/")
        dot = name.find(b".", slash + 1)
        if dot <= slash + 1 or dot == len(name) - 1:
            raise BadHeaderError(f"member {name!r} is not named '<key>.<field>'", pos)
        key = name[:dot].decode()
        if current is None or key != current[0]:
            if current is not None:
                yield current
            spans: dict[str, Span | None] = {}
            current = (key, {}, SampleLayout(start, (pos, pos + dot) if in_header else None, spans))
        field = field_names.get(name[dot + 1 :]) or _field_name(name[dot + 1 :])
        if field in current[1]:
            raise BadHeaderError(f"duplicate member {name!r}", pos)
        current[1][field] = buf[data : data + size].tobytes()
        current[2].fields[field] = (data, data + size)
    if current is not None:
        yield current


def parse(
    buf: memoryview,
    shard: str,
    base: int,
    first_index: int,
    *,
    until_end_marker: bool,
    check_headers: bool = True,
) -> tuple[list[Sample], int]:
    """Parse ``buf`` (starting at a header) into samples; also return where parsing stopped.

    ``base`` is ``buf``'s position in the file and ``first_index`` its first sample's, for error messages.
    Header checksums are checked unless the caller already checked the bytes (``check_headers=False``).
    """
    walk = Walk()
    walked = walk.headers
    samples: list[Sample] = []
    try:
        headers = walk_headers(buf, walk, until_end_marker=until_end_marker)
        samples.extend(group_samples(buf, resolve_names(buf, headers)))
    except (BadHeaderError, ValueError, IndexError) as exc:  # a bad checksum explains garbage best
        if check_headers:
            verify_checksums(buf, [h for h in walked if h + BLOCK <= len(buf)], shard, base)
        at = exc.pos if isinstance(exc, BadHeaderError) else (walked[-1] if walked else 0)
        detail = str(exc) if isinstance(exc, BadHeaderError) else f"malformed header: {exc}"
        raise CorruptShardError.at(
            shard, detail, sample_index=first_index + len(samples), offset=base + at
        ) from None
    if check_headers:
        verify_checksums(buf, walked, shard, base)
    return samples, walk.stop


def _size(raw: bytes) -> int:
    if raw[0] == 0x80:  # base-256, as GNU tar writes sizes of 8 GiB and more
        return int.from_bytes(raw[1:], "big")
    return int(raw.strip(b"\0 ") or b"0", 8)


def _field_name(raw: bytes) -> str:
    name = raw.decode()
    if len(_FIELD_NAMES) < 1024:
        _FIELD_NAMES[raw] = name
    return name


def pax_records(data: bytes, pos: int) -> Iterator[tuple[bytes, bytes]]:
    """Yield ``(keyword, value)`` of a PAX header's ``"<length> <keyword>=<value>\\n"`` records."""
    start = 0
    while start < len(data) and data[start] != 0:
        space = data.find(b" ", start)
        length = int(data[start:space]) if space > start else 0
        if length <= 0 or start + length > len(data):
            raise BadHeaderError("malformed PAX header", pos)
        keyword, _, value = data[space + 1 : start + length - 1].partition(b"=")
        start += length
        yield keyword, value


_LANES = np.uint64(0x00FF00FF00FF00FF)
_OCTAL_PLACES = 8 ** np.arange(5, -1, -1, dtype=np.int64)


def verify_checksums(buf: memoryview, headers: list[int], shard: str, base: int) -> None:
    """Check every header's checksum in one vectorised pass; fall back to Python for odd encodings.

    Bytes are summed eight at a time in four 16-bit lanes (64 words x 2 x 255 cannot overflow a lane),
    several times cheaper than widening every byte. The common ``"%06o\\0 "`` field is parsed in numpy too.
    Header positions must be multiples of the block size inside ``buf``.
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
            raise CorruptShardError.at(shard, "tar header checksum mismatch", offset=base + pos)
