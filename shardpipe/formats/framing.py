"""A small, safe binary codec for one sample: the record layout of LMDB values.

Layout, version 2 (all integers little-endian)::

    u32 field_count                    (the key counts as a field, stored first as ``__key__``)
    field_count x u64 data_length
    field_count x u16 name_length
    names, UTF-8, concatenated
    data, concatenated
    u64 checksum                       (xxh3_64 of every byte above; version 1 has no checksum)

The lengths come first as one fixed-width table, so decoding takes one ``struct`` call per record, and the
names block (equal for every record of a shard) is decoded once and cached. Decoding checks the header
against the record's length before touching the rest (a damaged length must not lead past the data), then
the checksum, then slices: a corrupt or hostile record raises :class:`FramingError`, never runs code.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import xxhash

from shardpipe.errors import CorruptShardError, DataError
from shardpipe.formats import bytecolumn
from shardpipe.formats.checksums import agrees
from shardpipe.formats.landing import Spans, land, lands
from shardpipe.formats.leases import BufferPool
from shardpipe.formats.terms import Column, ColumnsOut, Fields

VERSION = 2
VERSIONS = (1, 2)
_CHECKSUM = struct.Struct("<Q")
KEY_FIELD = "__key__"
_COUNT = struct.Struct("<I")
_MAX_FIELDS = 4096
_JOIN_BYTES = 16 << 10
_JOIN_MIN_RECORDS = 32
"""Records of at most ``_JOIN_BYTES`` each on average are worth joining, larger ones are cheaper to slice
where they lie; records are checked as arrays and landed from this many on, fewer do not pay for the fixed
cost (a few dozen numpy calls; docs/design.md, "Formats and the index")."""
_tables: dict[int, struct.Struct] = {}
_layouts: dict[tuple[str, ...], tuple[list[int], struct.Struct, tuple[int, ...], bytes]] = {}
_schemas: dict[bytes, tuple[str, ...]] = {}  # name-length table + names -> names; a shard repeats one


class FramingError(DataError):
    """A record's bytes do not follow the layout; the message says where."""


class RecordError(FramingError):
    """Record ``position`` of those decoded one by one is damaged."""

    def __init__(self, message: str, *, position: int = -1) -> None:
        super().__init__(message)
        self.position = position


def _table(count: int) -> struct.Struct:
    table = _tables.get(count)
    if table is None:
        table = _tables[count] = struct.Struct(f"<{count}Q{count}H")
    return table


def encode(key: str, fields: Mapping[str, bytes]) -> bytes:
    """Frame ``key`` and ``fields`` (in sorted name order, so equal samples give equal bytes)."""
    return b"".join(encode_batch([key], list(fields), [[data] for data in fields.values()])[0])


def encode_batch(
    keys: Sequence[str], names: Sequence[str], columns: Sequence[Column]
) -> list[list[bytes | memoryview]]:
    """Frame samples ``keys[i]`` with fields ``names[j] = columns[j][i]``; each record as its pieces
    (header, key, data in sorted name order, checksum), for the caller to join where it wants them.

    What depends only on the field names (the table's struct, the name lengths and bytes) is built once
    per set of names: a shard repeats one. The checksum is hashed over the pieces, not a joined copy.
    """
    layout = _layouts.get(tuple(names)) or _layout(names)
    order, table, name_lengths, raw_names = layout
    count = _COUNT.pack(len(order) + 1)
    ordered = [columns[j] for j in order]
    records = []
    for i, key in enumerate(keys):
        raw_key = key.encode()
        data = [column[i] for column in ordered]
        head = count + table.pack(len(raw_key), *map(len, data), *name_lengths) + raw_names + raw_key
        digest = xxhash.xxh3_64(head)
        for piece in data:
            digest.update(piece)
        records.append([head, *data, _CHECKSUM.pack(digest.intdigest())])
    return records


def _layout(names: Sequence[str]) -> tuple[list[int], struct.Struct, tuple[int, ...], bytes]:
    """Column order (sorted by name), the length table's struct, name lengths and names, for ``names``."""
    if KEY_FIELD in names:
        raise FramingError(f"a field is named {KEY_FIELD!r}, which holds the key")
    if len(names) >= _MAX_FIELDS:
        raise FramingError(f"a sample has {len(names)} fields; at most {_MAX_FIELDS - 1} fit")
    order = sorted(range(len(names)), key=names.__getitem__)
    raw_names = [name.encode() for name in (KEY_FIELD, *(names[j] for j in order))]
    if any(len(name) > 0xFFFF for name in raw_names):
        raise FramingError("a field name is longer than 65535 bytes")
    layout = (order, _table(len(raw_names)), tuple(len(name) for name in raw_names), b"".join(raw_names))
    if len(_layouts) < 1024:  # a few distinct name sets per job; never grow without bound
        _layouts[tuple(names)] = layout
    return layout


def _names(schema: bytes, count: int) -> tuple[str, ...]:
    lengths = struct.unpack_from(f"<{count}H", schema)
    raw, names, pos = schema[2 * count :], [], 0
    for length in lengths:
        names.append(raw[pos : pos + length].decode())
        pos += length
    if not names or names[0] != KEY_FIELD or len(set(names)) != count:
        raise FramingError(f"field names {names!r} must start with {KEY_FIELD!r} and be unique")
    if len(_schemas) < 1024:
        _schemas[schema] = tuple(names)
    return tuple(names)


def decode(record: bytes | memoryview, *, version: int = VERSION, check: bool = True) -> tuple[str, Fields]:
    """Return ``(key, fields)``, as bytes copied out of ``record`` (which may be a transient buffer).

    ``version`` is the shard's framing version; ``check=False`` skips a version-2 record's checksum.
    """
    view = record if isinstance(record, memoryview) else memoryview(record)
    names, lengths, pos, end = _header(view, version)
    # Hashed first, where the record lies; the copies below then read it from the CPU cache.
    if check and version >= 2 and not agrees(view[:end], _CHECKSUM.unpack_from(view, end)[0]):
        raise FramingError("record bytes differ from their checksum")
    key_end = pos + lengths[0]
    fields: Fields = {}
    stop = key_end
    for index in range(1, len(names)):
        start, stop = stop, stop + lengths[index]
        fields[names[index]] = view[start:stop].tobytes()
    try:
        key = str(view[pos:key_end], "utf-8")
    except UnicodeDecodeError as exc:
        raise FramingError(f"key is not UTF-8: {exc}") from exc
    return key, fields


def _header(view: memoryview, version: int) -> tuple[tuple[str, ...], tuple[int, ...], int, int]:
    """A record's field names (the key first), data lengths, where its data starts and where the checksum
    starts (or the record ends), the header checked against the record's length before anything else."""
    size = len(view)
    end = size - _CHECKSUM.size if version >= 2 else size
    try:
        (count,) = _COUNT.unpack_from(view, 0)
        if not 0 < count < _MAX_FIELDS:
            raise FramingError(f"record declares {count} fields")
        table = _table(count)
        if 4 + table.size > end:
            raise FramingError(f"record of {size} bytes is shorter than its header")
        lengths = table.unpack_from(view, 4)
        names_start = 4 + 8 * count
        pos = 4 + table.size + sum(lengths[count:])
        if pos + sum(lengths[:count]) != end:
            raise FramingError(f"record is {size} bytes, its header declares {pos + sum(lengths[:count])}")
        schema = bytes(view[names_start:pos])
        names = _schemas.get(schema) or _names(schema, count)
    except (struct.error, UnicodeDecodeError) as exc:
        raise FramingError(f"record of {size} bytes has a malformed header: {exc}") from exc
    return names, lengths[:count], pos, end


def record_spans(
    records: memoryview | Sequence[memoryview],
    sizes: np.ndarray,
    names: Sequence[str],
    *,
    version: int,
    check: bool,
) -> Spans | None:
    """Where each record's checked bytes, key and each of ``names`` lie (:class:`~.landing.Spans`), read
    from the headers as arrays; ``records`` is one buffer that holds them end to end (record i
    ``sizes[i]`` bytes) or one view each. ``None`` when there are none, when a record does not repeat the
    first one's field names or its header disagrees with its length (decode them one by one then, which
    names the fault)."""
    if not len(sizes):
        return None
    if isinstance(records, memoryview):
        firsts, first_record = np.cumsum(sizes) - sizes, records[: int(sizes[0])]
    else:  # one view each
        firsts, first_record = np.zeros(len(sizes), np.int64), records[0]
    try:
        first, _, header, _ = _header(first_record, version)
    except FramingError:
        return None
    count, tail = len(first), _CHECKSUM.size if version >= 2 else 0
    if int(sizes.min()) < header + tail:
        return None
    if isinstance(records, memoryview):
        data = np.frombuffer(records, np.uint8)
        heads = data[firsts[:, None] + np.arange(header)]
    else:
        heads = np.frombuffer(b"".join([record[:header] for record in records]), np.uint8)
        heads = heads.reshape(-1, header)
    table_end = 4 + 8 * count
    lengths = heads[:, 4:table_end].copy().view("<u8")  # (n, count)
    if not (
        (heads[:, :4] == heads[0, :4]).all()  # the field count
        and (heads[:, table_end:] == heads[0, table_end:]).all()
        and (lengths <= sizes[:, None].astype(np.uint64)).all()  # so that the sum cannot wrap
        and (header + lengths.sum(axis=1, dtype=np.uint64) + tail == sizes.astype(np.uint64)).all()
    ):
        return None
    cuts = np.empty((len(sizes), count + 1), np.int64)
    cuts[:, 0] = firsts + header
    np.cumsum(lengths.astype(np.int64), axis=1, out=cuts[:, 1:])
    cuts[:, 1:] += cuts[:, :1]
    missing = np.full(len(sizes), -1, np.int64)
    at = {name: j for j, name in enumerate(first)}
    starts = np.stack([cuts[:, at[name]] if name in at else missing for name in names], axis=1)
    stops = np.stack([cuts[:, at[name] + 1] if name in at else missing for name in names], axis=1)
    ends = firsts + sizes - tail
    checksums = None
    if check and version >= 2:
        if isinstance(records, memoryview):
            checksums = data[ends[:, None] + np.arange(tail)].copy().view("<u8")[:, 0]
        else:
            checksums = np.frombuffer(b"".join([record[-tail:] for record in records]), "<u8")
    return Spans(records, firsts, ends, checksums, cuts[:, 0], cuts[:, 1], starts, stops, in_file=False)


def decode_many(
    records: memoryview | Sequence[memoryview],
    names: Sequence[str],
    locate: Callable[[int], tuple[str, int]],
    *,
    version: int,
    check: bool,
    sizes: Sequence[int] | None = None,
    order: np.ndarray | None = None,
    pool: BufferPool | None = None,
) -> ColumnsOut:
    """``records`` (one view each, or one buffer holding them end to end, ``sizes`` bytes each) as keys
    and, for each of ``names``, one column of values (``None`` where a record lacks the field), copied out
    (the records may be transient buffers), in ``order`` (positions among the records; all in turn when
    ``None``). ``locate(i)`` names record i (its shard and sample) in errors. With a ``pool``, fields that
    average ``LANDED_MIN_BYTES`` land in buffers of their own.

    Records that share one set of field names are checked as arrays and gathered by the landing kernel
    (:func:`~.landing.land`); records that differ, or fewer than ``_JOIN_MIN_RECORDS`` without a pool,
    are decoded one by one, which names the fault.

    Raises :class:`~shardpipe.errors.CorruptShardError` naming the shard and the sample.
    """
    if isinstance(records, memoryview):
        assert sizes is not None, "records end to end need their sizes"
        lengths = np.asarray(sizes, np.int64)
    else:
        lengths = np.fromiter(map(len, records), np.int64, len(records))
    spans = None
    if pool is not None or len(lengths) >= _JOIN_MIN_RECORDS:
        spans = record_spans(records, lengths, names, version=version, check=check)
    if spans is not None:
        landed = None if pool is None else lands(spans.starts, spans.stops)
        return land(spans, names, locate, order=order, landed=landed, pool=pool)
    if isinstance(records, memoryview):
        bounds = [0, *itertools.accumulate(lengths.tolist())]
        records = [records[a:b] for a, b in itertools.pairwise(bounds)]
    try:
        return _decode_each(records, names, version=version, check=check, order=order)
    except RecordError as exc:
        shard, sample = locate(exc.position)
        raise CorruptShardError.at(shard, str(exc), sample_index=sample) from exc


def worth_joining(num_records: int, num_bytes: int) -> bool:
    """Whether records are decoded faster copied end to end into one buffer than where they lie."""
    return num_bytes <= _JOIN_BYTES * num_records


def _decode_each(
    records: Sequence[bytes | memoryview],
    names: Sequence[str],
    *,
    version: int,
    check: bool,
    order: np.ndarray | None = None,
) -> ColumnsOut:
    """Every record decoded in turn (a fault names its position in ``records``), then put in ``order``."""
    keys: list[str] = []
    fields: dict[str, list[bytes | None]] = {name: [] for name in names}
    for position, record in enumerate(records):
        try:
            key, sample = decode(record, version=version, check=check)
        except FramingError as exc:
            raise RecordError(str(exc), position=position) from exc
        keys.append(key)
        for name, values in fields.items():
            values.append(sample.get(name))
    return bytecolumn.in_order((keys, fields), order)
