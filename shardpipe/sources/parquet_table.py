"""A Parquet dataset as a source: one Parquet file, or a folder of them, in Hugging Face's layout.

Where a file list (:mod:`shardpipe.sources.file_list`) has a ``key`` column and paths to files, a
Parquet dataset holds the samples themselves: each row is a sample, each column a field. The rules:

* **Keys.** A row's key is ``{split}/{position}``, its position in its split (the split's files in path
  order, rows in file order) zero-padded to :data:`~.parquet_pieces.KEY_DIGITS` digits: keys sort in
  row order, and a row keeps its key when rows are added after it (a new file, or rows appended),
  because the width is fixed, never taken from the row count. Or the key is a column the user names
  (``key_column``): its strings, or its integers in decimal; unique across the whole dataset.
* **Fields.** A column becomes one field, named by the user's mapping (``field_map``, where an empty
  name leaves the column out) or by default: binary as bytes, strings as UTF-8, integers, booleans and
  other scalars as their decimal text (as in a file list), lists of numbers (at any depth, regular) as
  ``.npy`` bytes of their dtype (field ``{column}.npy``), and a struct ``{bytes, path}`` (Hugging Face's
  ``Image`` and ``Audio``) as its bytes, in a field named by the extension of ``path`` (or, without
  one, by the bytes' own signature: ``jpg``, ``png``, ``flac``...). A null cell, or a null struct, means
  the sample lacks that field. Any other type (nested structs, maps, lists of strings) is an
  :class:`~.parquet_columns.UnusableColumnError` naming the column (:mod:`.parquet_columns` decides
  each column's rule, :mod:`.parquet_cells` converts its cells).
* **Splits.** Each file's split comes from its name or folder (:mod:`.parquet_layout`); the pack keeps
  them unless asked to split by key hash.

The files are read in pieces, runs of row groups, by the pack's workers
(:func:`~.parquet_pieces.read_table_piece`), as a Parquet file list is; this process reads only the
footers, plans the pieces, then merges them in order. The result depends only on the files and the
options, not on the cutting: a row's number in a message is its row in its file.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Executor
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from shardpipe.errors import DataError, UsageError
from shardpipe.sources.file_list import group_runs
from shardpipe.sources.hf_features import (
    card_dataset_info,
    class_names_from_card,
    class_names_from_schema,
    features_from_schema,
)
from shardpipe.sources.ordered import in_order
from shardpipe.sources.parquet_columns import ColumnRule, column_rules
from shardpipe.sources.parquet_layout import ordered_splits
from shardpipe.sources.parquet_pieces import (
    KEY_DIGITS,
    TableFile,
    TablePiece,
    TablePieceRows,
    read_footer,
    read_table_piece,
)
from shardpipe.sources.table import Grouped

PIECE_BYTES = 8 << 20
"""Compressed row-group bytes per read task, as for a Parquet file list (whole row groups per task)."""


@dataclass(frozen=True, slots=True)
class TableScan:
    """A Parquet dataset scanned: samples field-major, each key's file and row, and what to record."""

    grouped: Grouped
    origins: dict[str, tuple[int, int]]
    """key -> (file number, row in the file)."""
    files: tuple[TableFile, ...]
    splits: tuple[str, ...]
    """The files' splits, in :func:`ordered_splits` order."""
    classes: tuple[str, ...] | None
    details: dict[str, Any] = field(default_factory=dict)
    """What the manifest's ``source`` records beside kind and path: layout, key rule, fields, features."""


def is_parquet_table(location: str, storage_options: Mapping[str, Any] | None) -> bool:
    """Whether a ``.parquet`` file is a dataset of its own (no ``key`` column, or written by ``datasets``)
    rather than a file list of paths with a ``key`` column."""
    _, schema, metadata = read_footer(location.rsplit("/", 1)[-1], location, storage_options)
    return "key" not in schema.names or features_from_schema(metadata) is not None


def scan_parquet_dataset(
    files: list[tuple[str, str]],
    shown: str,
    *,
    readme: str | None = None,
    field_map: Mapping[str, str] | None = None,
    key_column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    pool: Executor | None = None,
    top_split: str | None = None,
) -> TableScan:
    """Scan the Parquet (or Arrow) files ``(relative path, path or URL)`` of one dataset (``readme``: its
    card's text; ``top_split``: the split of files at the top, where a saved dataset names it).

    The footers are read first (on ``pool`` when given): every file must have the same columns, and
    every column a usable type, before any row is read. The pieces are read on ``pool`` too."""
    field_map = dict(field_map or {})
    footers = _read_footers(files, storage_options, pool, top_split)
    _check_one_schema(footers)
    first_file, schema, metadata = footers[0]
    found = [footer[0] for footer in footers]
    _check_one_folder_per_split(found, shown)
    rules = column_rules(schema, first_file.shown, field_map, key_column)
    pieces = _plan(found, rules, key_column, storage_options)
    grouped, origins, producers = _read_pieces(pieces, found, pool)
    features, class_names = _features(metadata, readme, found)
    fields = {rule.column: rule.field or _fields_of(rule.column, producers) for rule in rules}
    details: dict[str, Any] = {
        "files": len(found),
        "key": _key_rule(key_column),
        "fields": fields,
        **features,
    }
    by_field = {
        rule.field: class_names[rule.column] for rule in rules if rule.column in class_names and rule.field
    }
    if by_field:
        details["class_names"] = by_field
    splits = tuple(ordered_splits(f.split for f in found))
    return TableScan(grouped, origins, tuple(found), splits, _classes(by_field), details)


def _read_footers(
    files: list[tuple[str, str]],
    storage_options: Mapping[str, Any] | None,
    pool: Executor | None,
    top_split: str | None,
) -> list[tuple[Any, ...]]:
    """Each file's :func:`read_footer`, in the files' order (on ``pool`` when there are several); files
    at the top take ``top_split``."""
    given = [top_split if "/" not in relpath else None for relpath, _ in files]
    if pool is not None and len(files) > 1:
        options = [storage_options] * len(files)
        return list(pool.map(read_footer, *zip(*files, strict=True), options, given))
    return [
        read_footer(relpath, location, storage_options, split)
        for (relpath, location), split in zip(files, given, strict=True)
    ]


def _check_one_schema(footers: list[tuple[Any, ...]]) -> None:
    """Every file has the first one's columns and types: a dataset's files share one schema."""
    first_file, schema, _ = footers[0]
    for other, other_schema, _ in footers[1:]:
        if not other_schema.equals(schema):
            raise DataError(
                f"{other.shown} and {first_file.shown} have different columns ({other_schema.names} against "
                f"{schema.names}, or their types); a dataset's files share one schema: pack one "
                "configuration's folder at a time"
            )


def _read_pieces(
    pieces: list[TablePiece], files: list[TableFile], pool: Executor | None
) -> tuple[Grouped, dict[str, tuple[int, int]], dict[str, str]]:
    """Read the pieces (on ``pool`` when given) and merge them in plan order: the samples field-major,
    each key's file and row, and each field's column."""
    grouped: Grouped = {}
    origins: dict[str, tuple[int, int]] = {}
    producers: dict[str, str] = {}  # field -> the column it came from
    with closing(in_order(read_table_piece, pieces, pool)) as results:
        for piece, rows in zip(pieces, results, strict=True):
            _merge(piece, rows, grouped=grouped, origins=origins, producers=producers, files=files)
    return grouped, origins, producers


def _features(
    metadata: Mapping[bytes, bytes] | None, readme: str | None, files: list[TableFile]
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The dataset's Hugging Face features as the manifest's ``source`` records them, from the schema's
    metadata, else from the card's ``dataset_info`` (neither: nothing), and the class names they give
    by column."""
    features = features_from_schema(metadata)
    if features is not None:
        recorded: dict[str, Any] = {
            "features": features,
            "features_from": "parquet schema metadata (huggingface)",
        }
        return recorded, class_names_from_schema(features)
    if readme is not None and (info := card_dataset_info(readme, _config_of(files))) is not None:
        recorded = {"features": info.get("features"), "features_from": "README.md dataset_info"}
        return recorded, class_names_from_card(info)
    return {}, {}


def _key_rule(key_column: str | None) -> dict[str, str]:
    """How the samples' keys were made, as the manifest records it."""
    if key_column is not None:
        return {"column": key_column}
    return {"rule": f"{{split}}/{{position in the split:0{KEY_DIGITS}d}}"}


def _classes(by_field: dict[str, list[str]]) -> tuple[str, ...] | None:
    """The dataset's classes: the names of its one class-label field, or of ``cls`` among several."""
    if len(by_field) == 1 or "cls" in by_field:
        return tuple(by_field.get("cls") or next(iter(by_field.values())))
    return None


def _fields_of(column: str, producers: dict[str, str]) -> str:
    """The fields a blob column filled (one, unless a usage error was raised), comma-separated."""
    return ",".join(sorted(name for name, source in producers.items() if source == column))


def _check_one_folder_per_split(files: list[TableFile], shown: str) -> None:
    folders: dict[str, set[str]] = {}
    for found in files:
        folders.setdefault(found.split, set()).add(found.relpath.rpartition("/")[0])
    for split, where in folders.items():
        if len(where) > 1:
            listed = ", ".join(sorted(f"{folder or '.'}/" for folder in where))
            raise UsageError(
                f"{shown} holds split {split!r} in several folders ({listed}), as a dataset with several "
                "configurations does; pack one configuration's folder at a time"
            )


def _config_of(files: list[TableFile]) -> str | None:
    """The configuration the files belong to: their common first folder, unless it is ``data``."""
    tops = {found.relpath.split("/", 1)[0] for found in files if "/" in found.relpath}
    return next(iter(tops)) if len(tops) == 1 and tops != {"data"} else None


def _plan(
    files: list[TableFile],
    rules: tuple[ColumnRule, ...],
    key_column: str | None,
    storage_options: Mapping[str, Any] | None,
) -> list[TablePiece]:
    """The read tasks: each file's row groups in runs of about :data:`PIECE_BYTES`, in path order, each
    knowing its first row in its file and in its split."""
    pieces: list[TablePiece] = []
    positions: dict[str, int] = {}
    for number, found in enumerate(files):
        row = 0
        for start, stop in group_runs(list(found.group_bytes), PIECE_BYTES):
            position = positions.get(found.split, 0)
            piece = TablePiece(
                file=found,
                number=number,
                groups=(start, stop),
                first_row=row,
                first_position=position,
                rules=rules,
                key_column=key_column,
                storage_options=storage_options,
            )
            pieces.append(piece)
            count = sum(found.group_rows[start:stop])
            row += count
            positions[found.split] = position + count
    return pieces


def _merge(
    piece: TablePiece,
    rows: TablePieceRows,
    grouped: Grouped,
    origins: dict[str, tuple[int, int]],
    producers: dict[str, str],
    files: list[TableFile],
) -> None:
    """Add one piece's samples; raise on a key seen before, or a field two columns would fill."""
    keys = rows.keys
    new = set(keys)
    if len(new) != len(keys) or not new.isdisjoint(origins):
        here: dict[str, tuple[int, int]] = {}
        for index, key in enumerate(keys):
            earlier = origins.get(key) or here.get(key)
            if earlier is not None:
                raise DataError(
                    f"{piece.file.shown} row {piece.first_row + index + 1}: key {key!r} appears more than "
                    f"once (also {files[earlier[0]].shown} row {earlier[1] + 1}); keys must be unique "
                    "across the dataset"
                )
            here[key] = (piece.number, piece.first_row + index)
    origins.update((key, (piece.number, piece.first_row + i)) for i, key in enumerate(keys))
    for rule, names, cells in zip(piece.rules, rows.names, rows.cells, strict=True):
        if isinstance(names, str):
            _claim(producers, names, rule.column, piece)
            present = {
                key: (cell, len(cell)) for key, cell in zip(keys, cells, strict=True) if cell is not None
            }
            if present:
                grouped.setdefault(names, {}).update(present)
            continue
        for used in sorted({name for name in names if name is not None}):
            _claim(producers, used, rule.column, piece)
        for key, row_name, cell in zip(keys, names, cells, strict=True):
            if row_name is not None and cell is not None:
                grouped.setdefault(row_name, {})[key] = (cell, len(cell))


def _claim(producers: dict[str, str], name: str, column: str, piece: TablePiece) -> None:
    """Note that ``column`` fills field ``name``; a blob column filling several fields, or two columns
    one field, is a usage error."""
    owner = producers.setdefault(name, column)
    if owner != column:
        raise UsageError(
            f"columns {owner!r} and {column!r} of {piece.file.shown} would both fill field {name!r}; name "
            "them apart with the field mapping"
        )
    blob_fields = sorted(field for field, source in producers.items() if source == column)
    if len(blob_fields) > 1:
        raise UsageError(
            f"column {column!r} of {piece.file.shown} holds files of several types "
            f"({', '.join(blob_fields)}), and a dataset's samples share one set of fields; store them "
            f"under one name with the field mapping {column}=NAME"
        )
