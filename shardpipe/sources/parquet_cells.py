"""A Parquet column's cells as field bytes, by its :class:`~.parquet_columns.ColumnRule`; a key column's
cells as keys.

Binary cells as they are, strings as UTF-8, integers and other scalars as their decimal text (as a file
list stores them), lists of numbers as ``.npy`` bytes (no pickle), a ``{bytes, path}`` struct as its bytes
in a field named row by row (:func:`blob_name`). A null cell is None: the sample lacks that field. A bad
cell raises a :class:`~shardpipe.errors.DataError` naming its file and row (:class:`RowPlace`).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardpipe.errors import DataError
from shardpipe.sources.keys import SampleError, check_key
from shardpipe.sources.parquet_columns import ColumnRule

_MAGIC = (
    (b"\xff\xd8\xff", "jpg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"fLaC", "flac"),
    (b"OggS", "ogg"),
    (b"ID3", "mp3"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
    (b"BM", "bmp"),
)
"""A file's leading bytes and the extension they mean."""
_RIFF = {b"WEBP": "webp", b"WAVE": "wav", b"AVI ": "avi"}
"""A RIFF file's form type (bytes 8-12) and the extension it means."""


@dataclass(frozen=True, slots=True)
class RowPlace:
    """Where a piece's rows are, so that a message names a row by its file and its row in that file."""

    shown: str
    first_row: int

    def row(self, index: int) -> str:
        return f"{self.shown} row {self.first_row + index + 1}"


def key_cells(column: Any, name: str, where: RowPlace) -> list[str]:
    """A key column's cells as keys (integers in decimal), each checked by the rule a map's keys follow."""
    keys = [value if isinstance(value, str) or value is None else str(value) for value in column.to_pylist()]
    for index, key in enumerate(keys):
        try:
            check_key(key)
        except SampleError as exc:
            raise DataError(f"{where.row(index)}: key column {name!r}: {exc}") from None
    return keys  # type: ignore[return-value]


def field_cells(column: Any, rule: ColumnRule, where: RowPlace) -> list[bytes | None]:
    """Each row's field bytes of a column that is not a blob (None where the row lacks the field)."""
    # Python loops rather than Arrow casts: a worker's first cast costs more than converting a piece
    if rule.kind == "bytes":
        return column.to_pylist()  # type: ignore[no-any-return]
    if rule.kind == "text":
        return [None if value is None else value.encode() for value in column.to_pylist()]
    if rule.kind == "integer":
        return [None if value is None else b"%d" % value for value in column.to_pylist()]
    if rule.kind == "value":
        return [None if value is None else _text(value) for value in column.to_pylist()]
    return _arrays(column, rule, where)


def _text(value: Any) -> bytes:
    """A scalar as a file list stores it: a boolean as 1 or 0, anything else as its ``str``."""
    if isinstance(value, bool):
        return b"1" if value else b"0"
    return str(value).encode()


def _arrays(column: Any, rule: ColumnRule, where: RowPlace) -> list[bytes | None]:
    """Each row's list of numbers as ``.npy`` bytes of the column's dtype (no pickle)."""
    dtype = np.dtype(rule.dtype)
    flat = _is_list(column.type) and not _is_list(column.type.value_type)
    out: list[bytes | None] = []
    for index, scalar in enumerate(column):
        if not scalar.is_valid:
            out.append(None)
            continue
        try:
            if flat:
                values = scalar.values
                if values.null_count:
                    raise ValueError("it holds a null")
                array = values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
            else:
                nested = scalar.as_py()
                array = np.asarray(nested, dtype=dtype)
        except (ValueError, TypeError) as exc:
            raise DataError(
                f"{where.row(index)}, column {rule.column!r}: a list of numbers that is not a regular array "
                f"({exc})"
            ) from None
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        out.append(buffer.getvalue())
    return out


def _is_list(arrow_type: Any) -> bool:
    import pyarrow.types as t

    return bool(t.is_list(arrow_type) or t.is_large_list(arrow_type) or t.is_fixed_size_list(arrow_type))


def blob_cells(column: Any, rule: ColumnRule, where: RowPlace) -> tuple[list[str | None], list[bytes | None]]:
    """Each row's bytes of a ``{bytes, path}`` struct and its field name (None where the row lacks it)."""
    import pyarrow as pa

    combined = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    valid = combined.is_valid().to_pylist()
    data = combined.field("bytes").to_pylist()
    paths = combined.field("path").to_pylist()
    names: list[str | None] = []
    cells: list[bytes | None] = []
    for index, (ok, value, path) in enumerate(zip(valid, data, paths, strict=True)):
        if not ok or value is None:
            if ok and path is not None:
                raise DataError(
                    f"{where.row(index)}, column {rule.column!r}: no bytes, only the path {path!r}; the "
                    "dataset must hold its files' bytes. datasets' to_parquet keeps only paths (push_to_hub "
                    "and save_to_disk embed the bytes): embed them with ds = ds.with_format('arrow').map("
                    "datasets.table.embed_table_storage, batched=True), then save it again"
                )
            names.append(None)
            cells.append(None)
            continue
        names.append(rule.field or blob_name(path, value, rule.column))
        cells.append(value)
    return names, cells


def blob_name(path: str | None, data: bytes, column: str) -> str:
    """A file's field name: the extension of its ``path``, else its bytes' signature, else the column."""
    name = (path or "").rsplit("/", 1)[-1]
    extension = name.rsplit(".", 1)[1].lower() if "." in name.lstrip(".") else ""
    if extension.isalnum():
        return extension
    if data[:4] == b"RIFF" and data[8:12] in _RIFF:
        return _RIFF[data[8:12]]
    return next((found for magic, found in _MAGIC if data.startswith(magic)), column)
