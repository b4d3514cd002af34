"""Cutting samples out of the bytes a reader read, by their index rows: checked, then sliced.

A reader reads whole samples into a buffer and hands the bytes here with the samples' index rows
(:class:`~shardpipe.formats.layout.ShardIndex`): each sample's span is checked against its checksum (a
version-2 index), then its key and fields are sliced out, as ``(key, fields)`` samples
(:func:`cut_samples`), appended to columns (:func:`cut_columns`), or gathered as Arrow columns by index
arithmetic over many shards at once (:func:`cut_rows`). The spans were checked to lie inside their
samples when the index was loaded or built, so no slice leaves its sample; a bad sample is named by its
shard and position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from shardpipe.errors import CorruptShardError
from shardpipe.formats.bytecolumn import ByteColumn, gather, texts
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
from shardpipe.formats.terms import ColumnsOut

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


def cut_samples(
    view: memoryview, rows: Rows, index: ShardIndex, start: int, base: int, shard: str
) -> list[tuple[str, dict[str, bytes]]]:
    """Slice the keys and fields of ``rows``' samples (sample ``start`` first) out of ``view``, which holds
    the file from ``base``. The spans were checked to lie inside their samples when the index was loaded
    or built."""
    columns = [(name, index.first_field + 2 * j) for j, name in enumerate(index.fields)]
    out = []
    for i in range(len(rows) - 1):
        row = rows[i]
        sample: dict[str, bytes] = {}
        for name, column in columns:
            if (a := row[column]) != NO_SPAN:
                sample[name] = view[a - base : row[column + 1] - base].tobytes()
        try:
            key = str(view[row[KEY_START] - base : row[KEY_STOP] - base], "utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptShardError.at(shard, f"key is not UTF-8: {exc}", sample_index=start + i) from None
        out.append((key, sample))
    return out


ColumnSpecs = list[tuple[list[bytes | None], int]]


def column_specs(index: ShardIndex, fields: dict[str, list[bytes | None]]) -> ColumnSpecs:
    """``(values, start column)`` per field of ``fields``: what :func:`cut_columns` appends to."""
    return [(fields[name], index.first_field + 2 * index.fields.index(name)) for name in fields]


def cut_columns(
    view: memoryview, rows: Rows, columns: ColumnSpecs, *, start: int, base: int, shard: str, keys: list[str]
) -> None:
    """Append the keys and the field values (``columns``, from :func:`column_specs`) of ``rows``' samples
    (sample ``start`` first), sliced out of ``view`` (the file from ``base``) as :func:`cut_samples` does,
    without a dict per sample; a field a sample lacks is ``None``."""
    for i in range(len(rows) - 1):
        row = rows[i]
        try:
            keys.append(str(view[row[KEY_START] - base : row[KEY_STOP] - base], "utf-8"))
        except UnicodeDecodeError as exc:
            raise CorruptShardError.at(shard, f"key is not UTF-8: {exc}", sample_index=start + i) from None
        for values, column in columns:
            a = row[column]
            values.append(None if a == NO_SPAN else view[a - base : row[column + 1] - base].tobytes())


def cut_rows(
    view: memoryview,
    rows: np.ndarray,
    *,
    shift: np.ndarray,
    ends: np.ndarray,
    index: ShardIndex,
    names: Sequence[str],
    verified: bool,
    locate: Callable[[int], tuple[str, int]],
    order: np.ndarray | None = None,
) -> ColumnsOut:
    """Keys and field columns of samples whose index ``rows`` (laid out as ``index``'s) lie in ``view``
    at their file offsets plus ``shift``, each ending at ``ends`` in ``view``: what :func:`check_spans`
    and :func:`cut_columns` give run by run, by index arithmetic, in ``order`` (positions among
    ``rows``; all in turn when ``None``). ``locate(i)`` names row i's shard and sample for an error."""

    def corrupt(i: int, detail: str, offset: int | None = None) -> CorruptShardError:
        shard, sample = locate(i)
        return CorruptShardError.at(shard, detail, sample_index=sample, offset=offset)

    def at(column: int) -> np.ndarray:  # a column's offsets in ``view``
        offsets: np.ndarray = rows[:, column].astype(np.int64) + shift
        return offsets

    if verified and len(rows):
        bad = first_mismatch(view, at(OFFSET).tolist(), ends.tolist(), rows[:, CHECKSUM])
        if bad is not None:
            raise corrupt(bad, "sample bytes differ from their checksum", int(rows[bad, OFFSET]))
    keys = texts(view, at(KEY_START), at(KEY_STOP), order)
    if keys is None:
        keys = []
        for i, row in enumerate(rows.tolist()):  # the first key that fails, named
            span = view[row[KEY_START] + int(shift[i]) : row[KEY_STOP] + int(shift[i])]
            try:
                keys.append(str(span, "utf-8"))
            except UnicodeDecodeError as exc:
                raise corrupt(i, f"key is not UTF-8: {exc}") from None
        keys = keys if order is None else [keys[i] for i in order.tolist()]
    fields: dict[str, ByteColumn] = {}
    for name in names:
        column = index.first_field + 2 * index.fields.index(name)
        present = rows[:, column] != NO_SPAN
        fields[name] = gather(view, at(column), at(column + 1), None if present.all() else present, order)
    return keys, fields


def add_samples(
    keys: list[str], fields: dict[str, list[bytes | None]], samples: Iterable[tuple[str, dict[str, bytes]]]
) -> None:
    """Append ``(key, fields)`` samples to columns; a field a sample lacks is ``None``."""
    for key, sample in samples:
        keys.append(key)
        for name, values in fields.items():
            values.append(sample.get(name))
