"""A table dataset's files as their footers describe them, and the read of one piece: what a pack's
worker runs (:func:`read_table_piece`), picklable in and out.

A piece is a run of one file's row groups (an Arrow IPC file's record batches, :mod:`.arrow_files`); its
rows' keys are their positions in their split (or a key column's cells), and each kept column's cells
become field bytes (:mod:`.parquet_cells`). A bad row raises, named by its file and its row in that file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardpipe.errors import DataError
from shardpipe.sources.arrow_files import arrow_layout, is_arrow, read_arrow_batches
from shardpipe.sources.list_piece import ListSource, open_parquet
from shardpipe.sources.parquet_cells import RowPlace, blob_cells, field_cells, key_cells
from shardpipe.sources.parquet_columns import ColumnRule
from shardpipe.sources.parquet_layout import split_of
from shardpipe.storage import is_remote, redact_url

KEY_DIGITS = 10
"""Digits of a positional key: any split of fewer than ten billion rows keeps keys that sort in row order."""


@dataclass(frozen=True, slots=True)
class TableFile:
    """One Parquet file of the dataset, as its footer describes it."""

    relpath: str
    location: str
    split: str
    group_rows: tuple[int, ...]
    group_bytes: tuple[int, ...]

    @property
    def shown(self) -> str:
        return redact_url(self.location) if is_remote(self.location) else self.location


@dataclass(frozen=True, slots=True)
class TablePiece:
    """Row groups ``[groups[0], groups[1])`` of one file: what one read task needs, picklable."""

    file: TableFile
    number: int
    """The file's number in the dataset (for provenance)."""
    groups: tuple[int, int]
    first_row: int
    """The piece's first row within its file."""
    first_position: int
    """... within its split."""
    rules: tuple[ColumnRule, ...]
    key_column: str | None
    storage_options: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class TablePieceRows:
    """A piece read: its rows' keys, and per rule its field name (or each row's) and its cells."""

    keys: list[str]
    names: list[str | list[str | None]]
    cells: list[list[bytes | None]]


def read_footer(
    relpath: str, location: str, storage_options: Mapping[str, Any] | None, split: str | None = None
) -> tuple[Any, ...]:
    """``(TableFile, schema without metadata, schema metadata)`` of one file, from its footer only (an
    Arrow file's batches are counted); ``split`` overrides the one its path gives."""
    if is_arrow(location):
        schema, rows, sizes = arrow_layout(location, storage_options)
    else:
        source = ListSource(location, "parquet", storage_options=storage_options)
        try:
            with open_parquet(source) as parquet:
                metadata = parquet.metadata
                schema = parquet.schema_arrow
        except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
            raise DataError(f"cannot read Parquet file {source.shown}: {exc}") from exc
        rows, sizes = [], []
        for index in range(metadata.num_row_groups):
            group = metadata.row_group(index)
            rows.append(group.num_rows)
            sizes.append(sum(group.column(c).total_compressed_size for c in range(group.num_columns)))
    found = TableFile(
        relpath=relpath,
        location=location,
        split=split or split_of(relpath),
        group_rows=tuple(rows),
        group_bytes=tuple(sizes),
    )
    return found, schema.remove_metadata(), schema.metadata


def read_table_piece(piece: TablePiece) -> TablePieceRows:
    """Read one piece's rows and turn each kept column into field cells; a bad row raises, named by its
    file and row."""
    import pyarrow as pa

    source = ListSource(piece.file.location, "parquet", storage_options=piece.storage_options)
    wanted = [rule.column for rule in piece.rules] + ([piece.key_column] if piece.key_column else [])
    if is_arrow(piece.file.location):
        table = read_arrow_batches(piece.file.location, piece.storage_options, *piece.groups, wanted)
    else:
        try:
            with open_parquet(source) as parquet:
                table = parquet.read_row_groups(list(range(*piece.groups)), columns=wanted)
        except (OSError, ValueError) as exc:
            raise DataError(
                f"cannot read Parquet file {piece.file.shown} "
                f"(row groups {piece.groups[0]}-{piece.groups[1]}): {exc}"
            ) from exc
    where = RowPlace(piece.file.shown, piece.first_row)
    if piece.key_column is None:
        split, first = piece.file.split, piece.first_position
        keys = [f"{split}/{position:0{KEY_DIGITS}d}" for position in range(first, first + table.num_rows)]
    else:
        keys = key_cells(table.column(piece.key_column), piece.key_column, where)
    names: list[str | list[str | None]] = []
    cells: list[list[bytes | None]] = []
    for rule in piece.rules:
        column = table.column(rule.column)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if rule.kind == "blob":
            found_names, values = blob_cells(column, rule, where)
            names.append(found_names if rule.field is None else rule.field)
        else:
            names.append(rule.field or rule.column)
            values = field_cells(column, rule, where)
        cells.append(values)
    return TablePieceRows(keys, names, cells)
