"""One piece of a file list, read and sized by one task: the unit that spreads a list's scan over workers.

A piece is a byte range of a CSV or JSON Lines list (whole lines, by :mod:`shardpipe.sources.line_pieces`'s
rule; a CSV piece is parsed below the file's header line) or a run of a Parquet list's row groups. The task
(:func:`read_list_piece`) parses its piece with pyarrow, checks its keys, stats its path cells (a URL
cell's size comes from its store) and returns columns, never one object per row. Invariants:

* the result depends only on ``(ListSource, piece)``: any process or node gives the same value;
* a problem in a row is returned, not raised, with the row's index within the piece: only the driver,
  merging pieces in order, knows how many rows came before (:mod:`shardpipe.sources.file_list`);
* the result carries each column's inferred type, so the driver can tell whether pyarrow would have
  inferred the same types from the whole file (a CSV or JSON list's types are inferred from its values).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardpipe.errors import DataError, UsageError
from shardpipe.sources.line_pieces import first_line, owned_lines
from shardpipe.sources.urls import Stores, join_cell, sizes_of
from shardpipe.storage import Store, is_remote, open_store, redact_url, split_url

KINDS = {
    ".csv": "csv",
    ".jsonl": "json",
    ".ndjson": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
}
"""A list's kind by the suffix of its name."""

Cell = str | bytes | None
"""A path or URL (``str``), literal bytes, or None where the row has no value."""


@dataclass(frozen=True, slots=True)
class ListSource:
    """What every piece task of one list needs: where it is, how to parse it, which columns are values."""

    location: str
    """A local path or a URL (which may carry credentials: print :attr:`shown`)."""
    kind: str
    """``csv``, ``json`` or ``parquet``."""
    literal: frozenset[str] = frozenset()
    storage_options: Mapping[str, Any] | None = None

    @property
    def remote(self) -> bool:
        return is_remote(self.location)

    @property
    def shown(self) -> str:
        return redact_url(self.location) if self.remote else self.location

    def store(self) -> tuple[Store, str]:
        """The store holding the list and the list's key in it."""
        if self.remote:
            return Stores(self.storage_options).locate(self.location)
        parent, name = split_url(self.location)
        return open_store(parent), name


@dataclass(frozen=True, slots=True)
class PieceColumns:
    """A piece read: its row count, columns and types as parsed, and per field the cells of its rows."""

    num_rows: int
    columns: tuple[str, ...]
    """Every column of the piece as parsed, ``key`` included, in the list's order."""
    types: tuple[str, ...]
    """Each column's Arrow type as inferred from this piece (``null`` when all its cells were empty)."""
    keys: list[str]
    """The rows' keys, in order; on a problem, only those of the rows checked before it."""
    fields: tuple[str, ...]
    cells: list[list[Cell]]
    """``cells[j][i]``: field ``fields[j]`` of row ``i`` (empty lists on a problem)."""
    sizes: list[list[int]]
    problem: tuple[int, str] | None = None
    """``(row index in the piece, message after "row N")``: the first bad row, which ends the read."""


def list_kind(location: str) -> str:
    """``csv``, ``json`` or ``parquet``, from the list's name (a URL's query string left out)."""
    name = location.split("?", 1)[0].rsplit("/", 1)[-1] if is_remote(location) else Path(location).name
    suffix = "." + name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if suffix not in KINDS:
        shown = redact_url(location) if is_remote(location) else location
        raise UsageError(f"{shown}: unknown list type {suffix!r}; use .csv, .jsonl or .parquet")
    return KINDS[suffix]


def read_list_piece(source: ListSource, piece: tuple[int, int], whole: bool = False) -> PieceColumns:
    """Read, check and size one piece: bytes ``[start, stop)`` of a text list, row groups of a Parquet one.

    ``whole``: the piece is the entire list, read as one table exactly as pyarrow reads the file.
    """
    try:
        table = _read_table(source, piece, whole)
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        where = "" if whole else f" (piece {piece[0]}-{piece[1]})"
        raise DataError(f"cannot read file list {source.shown}{where}: {exc}") from exc
    return _columns(source, table)


def _read_table(source: ListSource, piece: tuple[int, int], whole: bool) -> Any:
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.json

    if source.kind == "parquet":
        with open_parquet(source) as parquet:
            groups = range(parquet.metadata.num_row_groups) if whole else range(*piece)
            return parquet.read_row_groups(list(groups))
    store, key = source.store()
    size = store.size(key)
    start, stop = (0, size) if whole else piece
    if stop > size:
        raise DataError(
            f"cannot read file list {source.shown}: it has {size} bytes, but had at least {stop} when it "
            f"was cut into pieces; a list must not change during a pack"
        )

    def read(first: int, last: int) -> bytes:
        return store.read_range(key, first, last)

    data = owned_lines(read, size, start, stop)
    if source.kind == "json":
        if start > 0 and not data.strip():
            return pa.table({})  # no line starts in this piece
        return pyarrow.json.read_json(pa.BufferReader(data))
    if start > 0:  # the header is the file's first line, which piece 0 holds
        if not data:
            return pa.table({})
        data = first_line(read, size) + data
    return pyarrow.csv.read_csv(pa.BufferReader(data))


@contextmanager
def open_parquet(source: ListSource) -> Iterator[Any]:
    """The list as a ``pyarrow.parquet.ParquetFile``: by path when local (pyarrow's own reads), else
    through a file object of its store."""
    import pyarrow.parquet

    store, key = source.store()
    local = store.local_path(key)
    if local is not None:
        parquet = pyarrow.parquet.ParquetFile(local)
        try:
            yield parquet
        finally:
            parquet.close()
        return
    with store.open(key) as file:
        yield pyarrow.parquet.ParquetFile(file)


def _columns(source: ListSource, table: Any) -> PieceColumns:
    """The table as checked columns: keys validated, paths stat'ed, URLs sized, values as bytes.

    The problem reported is the first bad row's (within a row: the key, then the fields in column order),
    as a row-by-row read would find it; rows after it are not checked.
    """
    columns = tuple(table.column_names)
    types = tuple(str(table.schema.field(name).type) for name in columns)
    num_rows = table.num_rows
    keys: list[Any] = table.column("key").to_pylist() if "key" in columns else [None] * num_rows
    limit = next((row for row, key in enumerate(keys) if not isinstance(key, str) or not key), num_rows)
    problems: list[tuple[int, int, str]] = []  # (row, field index or -1 for the key, message)
    if limit < num_rows:
        problems.append((limit, -1, f": 'key' must be a non-empty string, got {keys[limit]!r}"))
    fields = tuple(name for name in columns if name != "key")
    base = Path(source.location).parent
    cells: list[list[Cell]] = []
    sizes: list[list[int]] = []
    remote: list[tuple[int, int, str]] = []  # (row, field index, URL): sized together below
    for j, name in enumerate(fields):
        column: list[Cell] = [None] * num_rows
        column_sizes = [0] * num_rows
        is_value = name in source.literal
        for row, value in enumerate(table.column(name).to_pylist()[:limit]):
            if value is None or (value == "" and not is_value):  # an empty path: the sample lacks the field
                continue
            if isinstance(value, str) and not is_value and (source.remote or "://" in value):
                url = join_cell(source.location, value)
                column[row] = url
                remote.append((row, j, url))
            elif isinstance(value, str) and not is_value:
                path = str(base / value)
                try:
                    column_sizes[row] = os.stat(path).st_size
                except OSError as exc:
                    message = f" ({keys[row]}), field {name!r}: cannot read {path}: {exc.strerror}"
                    problems.append((row, j, message))
                    limit = row  # later rows are not checked: this one is reported
                    break
                column[row] = path
            else:
                data = _literal_bytes(value)
                column[row], column_sizes[row] = data, len(data)
        cells.append(column)
        sizes.append(column_sizes)
    remote = [(row, j, url) for row, j, url in remote if row <= limit]
    found = sizes_of([url for *_, url in remote], source.storage_options) if remote else []
    for (row, j, _), size in zip(remote, found, strict=True):
        if isinstance(size, DataError):
            problems.append((row, j, f" ({keys[row]}), field {fields[j]!r}: {size}"))
        else:
            sizes[j][row] = size
    if problems:
        row, j, message = min(problems)
        checked = keys[: row + 1] if j >= 0 else keys[:row]
        return PieceColumns(num_rows, columns, types, checked, (), [], [], (row, message))
    return PieceColumns(num_rows, columns, types, keys, fields, cells, sizes)


def _literal_bytes(value: Any) -> bytes:
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, bytes):
        return value
    return str(value).encode()
