"""The ``tf.train.Example`` protobuf, encoded and parsed by hand for the TFRecord format.

Only what sample shards need: an Example is a map of features, each ``bytes_list``, ``int64_list`` or
``float_list``. Ours hold ``__key__`` then one single-value bytes_list per field in sorted order, and
:func:`own_spans` finds their values without building objects; anything else goes through the general
parser, int64 and float lists becoming ASCII text. The generic protobuf library is several times slower
than reading the bytes (docs/design.md, "Formats and the index"). Parsing raises ``ValueError`` or
``IndexError`` on malformed bytes; the caller names the shard.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from shardpipe.formats.terms import Fields, Span

KEY_FEATURE = "__key__"
_NAMES: dict[bytes, str] = {}  # decoded feature names: every record repeats the same few


_SMALL_VARINTS = [bytes((i,)) for i in range(0x80)]


def varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def entry_head(name: str, size: int) -> bytes:
    """A feature map entry up to its value: ``{name, Feature{bytes_list{value}}}`` for a value of ``size``."""
    raw_name = name.encode()
    value_len = varint(size)
    bytes_list = 1 + len(value_len) + size  # BytesList{value}
    bytes_list_len = varint(bytes_list)
    feature = 1 + len(bytes_list_len) + bytes_list  # Feature{bytes_list}
    feature_len, name_len = varint(feature), varint(len(raw_name))
    entry = 1 + len(name_len) + len(raw_name) + 1 + len(feature_len) + feature  # map entry
    return b"".join(
        (
            b"\x0a",
            varint(entry),
            b"\x0a",
            name_len,
            raw_name,
            b"\x12",
            feature_len,
            b"\x0a",
            bytes_list_len,
            b"\x0a",
            value_len,
        )
    )


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


def own_spans(buf: bytes, pos: int, end: int) -> dict[str, Span] | None:
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
    spans = own_spans(buf, start, end)
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
