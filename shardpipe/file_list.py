"""File lists as a source: CSV, JSON Lines or Parquet, with a ``key`` column and one column per field.

A string cell is a file path relative to the list's folder (or a URL, read through the storage seam),
unless its column is named literal; other cells are values. The list itself may be a URL.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from shardpipe.errors import DataError, UsageError
from shardpipe.remote_source import join_cell, read_list_bytes, sizes_of
from shardpipe.sources import Grouped
from shardpipe.storage import is_remote, redact_url


def scan_file_list(
    list_path: Path | str,
    *,
    literal_fields: Iterable[str] = (),
    storage_options: Mapping[str, Any] | None = None,
) -> Grouped:
    """Read a CSV / JSON Lines / Parquet list with a ``key`` column and one column per field.

    String cells are file paths (relative to the list's folder) unless the column is in
    ``literal_fields``; numbers and booleans are stored as their decimal text; empty cells mean the
    sample lacks that field. Keys must be unique. A cell may be a URL, and the list itself may be one
    (then its relative cells are URLs under the list's folder): their sizes come from the store.
    """
    remote_list = is_remote(list_path)
    source_url = str(list_path)  # the base of relative cells when the list is remote
    base = Path(list_path).parent
    table = _read_table(source_url if remote_list else Path(list_path), storage_options)
    shown = redact_url(source_url) if remote_list else source_url
    columns = table.column_names
    if "key" not in columns:
        raise DataError(f"{shown} has no 'key' column (found: {', '.join(columns)})")
    literal = set(literal_fields)
    unknown = literal - set(columns)
    if unknown:
        raise UsageError(f"literal fields {', '.join(sorted(unknown))} are not columns of {shown}")
    grouped: Grouped = {}
    remote: list[tuple[str, str, int, str]] = []  # (field, key, row, URL): sized together below
    seen: set[str] = set()
    for row_index, row in enumerate(table.to_pylist()):
        key = row.pop("key")
        if not isinstance(key, str) or not key:
            raise DataError(f"{shown} row {row_index + 1}: 'key' must be a non-empty string, got {key!r}")
        if key in seen:
            raise DataError(f"{shown}: key {key!r} appears more than once; keys must be unique")
        seen.add(key)
        for name, value in row.items():
            if value is None:
                continue
            if isinstance(value, str) and name not in literal and (remote_list or "://" in value):
                remote.append((name, key, row_index, join_cell(source_url, value)))
                continue
            if isinstance(value, str) and name not in literal:
                path = str(base / value)
                try:
                    cell: tuple[str | bytes, int] = (path, os.stat(path).st_size)
                except OSError as exc:
                    raise DataError(
                        f"{shown} row {row_index + 1} ({key}), field {name!r}: cannot read {path}: "
                        f"{exc.strerror}"
                    ) from exc
            else:
                data = _literal_bytes(value)
                cell = (data, len(data))
            grouped.setdefault(name, {})[key] = cell
    sizes = sizes_of([url for *_, url in remote], storage_options)
    for (name, key, row_index, url), size in zip(remote, sizes, strict=True):
        if isinstance(size, DataError):
            raise DataError(f"{shown} row {row_index + 1} ({key}), field {name!r}: {size}") from size
        grouped.setdefault(name, {})[key] = (url, size)
    return grouped


def _literal_bytes(value: Any) -> bytes:
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, bytes):
        return value
    return str(value).encode()


def _read_table(path: Path | str, storage_options: Mapping[str, Any] | None = None) -> Any:
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.json
    import pyarrow.parquet

    readers = {
        ".csv": pyarrow.csv.read_csv,
        ".jsonl": pyarrow.json.read_json,
        ".ndjson": pyarrow.json.read_json,
        ".json": pyarrow.json.read_json,
        ".parquet": pyarrow.parquet.read_table,
        ".pq": pyarrow.parquet.read_table,
    }
    name = urlsplit(path).path.rsplit("/", 1)[-1] if isinstance(path, str) else path.name
    suffix = "." + name.rsplit(".", 1)[-1].lower() if "." in name else ""
    shown = redact_url(path) if isinstance(path, str) else str(path)
    reader = readers.get(suffix)
    if reader is None:
        raise UsageError(f"{shown}: unknown list type {suffix!r}; use .csv, .jsonl or .parquet")
    try:
        if isinstance(path, str):  # a URL: read whole through the store, parsed from memory
            return reader(pa.BufferReader(read_list_bytes(path, storage_options)))
        return reader(path)
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        raise DataError(f"cannot read file list {shown}: {exc}") from exc
