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

import struct
from collections.abc import Mapping, Sequence

import xxhash

from shardpipe.errors import DataError
from shardpipe.formats import Column, Fields

VERSION = 2
VERSIONS = (1, 2)
_CHECKSUM = struct.Struct("<Q")
KEY_FIELD = "__key__"
_COUNT = struct.Struct("<I")
_MAX_FIELDS = 4096
_tables: dict[int, struct.Struct] = {}
_layouts: dict[tuple[str, ...], tuple[list[int], struct.Struct, tuple[int, ...], bytes]] = {}
_schemas: dict[bytes, tuple[str, ...]] = {}  # name-length table + names -> names; a shard repeats one


class FramingError(DataError):
    """A record's bytes do not follow the layout; the message says where."""


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
    size = len(record)
    end = size - _CHECKSUM.size if version >= 2 else size
    try:
        (count,) = _COUNT.unpack_from(record, 0)
        if not 0 < count < _MAX_FIELDS:
            raise FramingError(f"record declares {count} fields")
        table = _table(count)
        if 4 + table.size > end:
            raise FramingError(f"record of {size} bytes is shorter than its header")
        lengths = table.unpack_from(record, 4)
        names_start = 4 + 8 * count
        pos = 4 + table.size + sum(lengths[count:])
        if pos + sum(lengths[:count]) != end:
            raise FramingError(f"record is {size} bytes, its header declares {pos + sum(lengths[:count])}")
        view = record if isinstance(record, memoryview) else memoryview(record)
        if (
            check
            and version >= 2
            and xxhash.xxh3_64_intdigest(view[:end]) != _CHECKSUM.unpack_from(view, end)[0]
        ):
            raise FramingError("record bytes differ from their checksum")
        schema = bytes(view[names_start:pos])
        names = _schemas.get(schema) or _names(schema, count)
    except (struct.error, UnicodeDecodeError) as exc:
        raise FramingError(f"record of {size} bytes has a malformed header: {exc}") from exc
    key_end = pos + lengths[0]
    try:
        key = str(view[pos:key_end], "utf-8")
    except UnicodeDecodeError as exc:
        raise FramingError(f"key is not UTF-8: {exc}") from exc
    fields: Fields = {}
    pos = key_end
    for index in range(1, count):
        stop = pos + lengths[index]
        fields[names[index]] = view[pos:stop].tobytes()
        pos = stop
    return key, fields
