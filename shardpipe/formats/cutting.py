"""Cutting samples out of the bytes a reader read, by their index rows: checked, then sliced.

A reader reads whole samples into a buffer and hands the bytes here with the samples' index rows
(:class:`~shardpipe.formats.layout.ShardIndex`): each sample's span is checked against its checksum (a
version-2 index), then its key and fields are sliced out and appended to columns (:func:`cut_columns`):
the path of a few samples at a time (many go through :func:`.landing.land`). The spans were checked to lie
inside their samples when the index was loaded or built, so no slice leaves its sample; a bad sample is
named by its shard and position.
"""

from __future__ import annotations

from collections.abc import Iterable

from shardpipe.errors import CorruptShardError
from shardpipe.formats.checksums import first_mismatch
from shardpipe.formats.layout import (
    CHECKSUM,
    KEY_START,
    KEY_STOP,
    NO_SPAN,
    OFFSET,
    PARSE,
    ShardIndex,
)

Rows = list[list[int]]
"""Index rows ``start..stop`` inclusive as Python ints (:meth:`ShardIndex.rows`): one numpy call per span,
then plain Python, which is what a span of a few samples can afford."""


def check_spans(view: memoryview, rows: Rows, start: int, base: int, shard: str) -> None:
    """Raise naming the first sample of ``rows`` (sample ``start`` first; ``view`` holds the file from byte
    ``base``) whose bytes differ from its checksum. ``rows`` must come from a version-2 index."""
    begins = [row[OFFSET] - base for row in rows]
    bad = first_mismatch(view, begins[:-1], begins[1:], [row[CHECKSUM] for row in rows[:-1]])
    if bad is not None:
        detail = "sample bytes differ from their checksum"
        raise CorruptShardError.at(shard, detail, sample_index=start + bad, offset=base + begins[bad])


def is_plain(rows: Rows) -> bool:
    """Whether all samples of ``rows`` can be sliced by their spans (none needs the parser)."""
    return all(row[KEY_START] != PARSE for row in rows[:-1])


ColumnSpecs = list[tuple[list[bytes | None], int]]


def column_specs(index: ShardIndex, fields: dict[str, list[bytes | None]]) -> ColumnSpecs:
    """``(values, start column)`` per field of ``fields``: what :func:`cut_columns` appends to."""
    return [(fields[name], index.first_field + 2 * index.fields.index(name)) for name in fields]


def cut_columns(
    view: memoryview, rows: Rows, columns: ColumnSpecs, *, start: int, base: int, shard: str, keys: list[str]
) -> None:
    """Append the keys and the field values (``columns``, from :func:`column_specs`) of ``rows``' samples
    (sample ``start`` first), sliced out of ``view`` (the file from ``base``); a field a sample lacks is
    ``None``."""
    for i in range(len(rows) - 1):
        row = rows[i]
        try:
            keys.append(str(view[row[KEY_START] - base : row[KEY_STOP] - base], "utf-8"))
        except UnicodeDecodeError as exc:
            raise CorruptShardError.at(shard, f"key is not UTF-8: {exc}", sample_index=start + i) from None
        for values, column in columns:
            a = row[column]
            values.append(None if a == NO_SPAN else view[a - base : row[column + 1] - base].tobytes())


def add_samples(
    keys: list[str], fields: dict[str, list[bytes | None]], samples: Iterable[tuple[str, dict[str, bytes]]]
) -> None:
    """Append ``(key, fields)`` samples to columns; a field a sample lacks is ``None``."""
    for key, sample in samples:
        keys.append(key)
        for name, values in fields.items():
            values.append(sample.get(name))
