"""File lists as a source: CSV, JSON Lines or Parquet, with a ``key`` column and one column per field.

A string cell is a file path relative to the list's folder (or a URL, read through the storage seam),
unless its column is named literal; other cells are values. The list itself may be a URL.

The list is read in pieces (:mod:`shardpipe.sources.list_piece`), each by one task on the pack's pool: byte
ranges of whole lines for CSV and JSON Lines (so a value must not contain a newline, pyarrow's CSV default),
runs of row groups for Parquet. This process reads only metadata (a size, a Parquet footer), then merges the
pieces' columns in piece order. Invariants:

* the result is the same for any cutting into pieces, and the same as reading the whole list at once:
  a row's number in a message is its number in the whole list (earlier pieces' rows are added here), and
  keys are checked for uniqueness across pieces;
* a CSV or JSON list's column types are inferred by pyarrow from the values; when the pieces disagree
  (a column of integers in one piece and of decimals in another, say), the list is read again as one
  piece, so the types are the whole file's, as before the list was cut.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Mapping
from concurrent.futures import Executor
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import Any

from shardpipe.errors import DataError, UsageError
from shardpipe.sources.line_pieces import cut_ranges
from shardpipe.sources.list_piece import ListSource, PieceColumns, list_kind, open_parquet, read_list_piece
from shardpipe.sources.ordered import in_order
from shardpipe.sources.table import Grouped

PIECE_BYTES = 8 << 20
"""Bytes of a list per task (for Parquet: compressed row groups, whole groups per task). Large enough
that a task's overhead (a pickle round trip, or a Ray task) is small beside parsing and statting its
rows, small enough that a list of a few hundred MiB spreads over dozens of workers and that a task sizing
URL cells (a request each) ends in reasonable time; a list below this is one piece, read as one table."""

_TEXT_TYPES = frozenset({"string", "large_string", "binary", "large_binary"})


def scan_file_list(
    list_path: Path | str,
    *,
    literal_fields: Iterable[str] = (),
    storage_options: Mapping[str, Any] | None = None,
    pool: Executor | None = None,
) -> Grouped:
    """Read a CSV / JSON Lines / Parquet list with a ``key`` column and one column per field.

    String cells are file paths (relative to the list's folder) unless the column is in
    ``literal_fields``; numbers and booleans are stored as their decimal text; empty cells mean the
    sample lacks that field. Keys must be unique. A cell may be a URL, and the list itself may be one
    (then its relative cells are URLs under the list's folder): their sizes come from the store. The
    pieces are read on ``pool`` when given, else here, by the same code.
    """
    location = str(list_path)
    source = ListSource(location, list_kind(location), frozenset(literal_fields), storage_options)
    pieces = plan_pieces(source, PIECE_BYTES)
    with closing(_read(source, pieces, pool)) as results:
        grouped = _merge(source, results)
    if grouped is None:  # the pieces' inferred types disagree: infer them from the whole list
        with closing(_read(source, [(0, -1)], pool)) as results:
            grouped = _merge(source, results)
    if grouped is None:
        raise RuntimeError(f"{source.shown} read as one piece disagrees with itself")  # cannot happen
    return grouped


def plan_pieces(source: ListSource, piece_bytes: int) -> list[tuple[int, int]]:
    """Cut the list into pieces of about ``piece_bytes``, from its size or its Parquet footer only."""
    try:
        if source.kind != "parquet":
            store, key = source.store()
            return cut_ranges(store.size(key), piece_bytes)
        with open_parquet(source) as parquet:
            metadata = parquet.metadata
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        raise DataError(f"cannot read file list {source.shown}: {exc}") from exc
    sizes = []
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        sizes.append(sum(group.column(c).total_compressed_size for c in range(group.num_columns)))
    return group_runs(sizes, piece_bytes)


def group_runs(sizes: list[int], piece_bytes: int) -> list[tuple[int, int]]:
    """Consecutive items as ``[start, stop)`` runs of at most ``piece_bytes`` (one item may exceed it)."""
    runs, start, total = [], 0, 0
    for index, size in enumerate(sizes):
        if index > start and total + size > piece_bytes:
            runs.append((start, index))
            start, total = index, 0
        total += size
    runs.append((start, len(sizes)))
    return runs


def _read(
    source: ListSource, pieces: list[tuple[int, int]], pool: Executor | None
) -> Generator[PieceColumns, None, None]:
    """Each piece's columns, in piece order; read on ``pool`` (all submitted at once) or here.

    A single piece is the whole list: ``(0, -1)`` asks for that explicitly."""
    return in_order(partial(read_list_piece, source, whole=len(pieces) == 1), pieces, pool)


def _merge(source: ListSource, results: Iterator[PieceColumns]) -> Grouped | None:
    """The pieces' samples, field-major; None when pyarrow would have typed the whole list differently.

    A row's problem is raised only once every piece is in: a column's type, and so whether a cell is a
    path or a value, may hinge on a later piece."""
    grouped: Grouped = {}
    seen: set[str] = set()
    columns: dict[str, None] = {}  # every piece's columns, in order of appearance
    types: dict[str, str] = {}
    null_typed: set[str] = set()
    num_rows = 0
    error: DataError | None = None
    for piece in results:
        columns.update(dict.fromkeys(piece.columns))
        if piece.num_rows:  # an empty piece infers nothing
            for name, kind in zip(piece.columns, piece.types, strict=True):
                if kind == "null":
                    null_typed.add(name)
                elif types.setdefault(name, kind) != kind:
                    return None
        if error is None:
            try:
                _add(source.shown, piece, num_rows, grouped, seen)
            except DataError as exc:
                error, grouped = exc, {}
        num_rows += piece.num_rows
    if source.kind == "csv" and any(types.get(name) in _TEXT_TYPES for name in null_typed):
        return None  # an empty CSV cell is null alone but "" in a text column
    if "key" not in columns:
        raise DataError(f"{source.shown} has no 'key' column (found: {', '.join(columns)})")
    unknown = source.literal - set(columns)
    if unknown:
        raise UsageError(f"literal fields {', '.join(sorted(unknown))} are not columns of {source.shown}")
    if error is not None:
        raise error
    return grouped


def _add(shown: str, piece: PieceColumns, offset: int, grouped: Grouped, seen: set[str]) -> None:
    """Merge one piece whose first row is row ``offset + 1`` of the list; raise its first problem."""
    keys = piece.keys
    new = set(keys)
    if len(new) != len(keys) or not seen.isdisjoint(new):
        here: set[str] = set()
        for index, key in enumerate(keys):
            if key in seen or key in here:
                row = offset + index + 1
                raise DataError(f"{shown} row {row}: key {key!r} appears more than once; keys must be unique")
            here.add(key)
    seen |= new
    if piece.problem is not None:
        row, message = piece.problem
        raise DataError(f"{shown} row {offset + row + 1}{message}")
    for name, cells, sizes in zip(piece.fields, piece.cells, piece.sizes, strict=True):
        present = {
            key: (cell, size) for key, cell, size in zip(keys, cells, sizes, strict=True) if cell is not None
        }
        if present:
            grouped.setdefault(name, {}).update(present)
