"""A Parquet dataset as a source: one Parquet file, or a folder of them, in Hugging Face's layout.

Where a file list (:mod:`shardpipe.sources.file_list`) has a ``key`` column and paths to files, a
Parquet dataset holds the samples themselves: each row is a sample, each column a field. The rules:

* **Keys.** A row's key is ``{split}/{position}``, its position in its split (the split's files in path
  order, rows in file order) zero-padded to :data:`KEY_DIGITS` digits: keys sort in row order, and a
  row keeps its key when rows are added after it (a new file, or rows appended), because the width is
  fixed, never taken from the row count. Or the key is a column the user names (``key_column``): its
  strings, or its integers in decimal; unique across the whole dataset.
* **Fields.** A column becomes one field, named by the user's mapping (``field_map``, where an empty
  name leaves the column out) or by default: binary as bytes, strings as UTF-8, integers, booleans and
  other scalars as their decimal text (as in a file list), lists of numbers (at any depth, regular) as
  ``.npy`` bytes of their dtype (field ``{column}.npy``), and a struct ``{bytes, path}`` (Hugging Face's
  ``Image`` and ``Audio``) as its bytes, in a field named by the extension of ``path`` (or, without
  one, by the bytes' own signature: ``jpg``, ``png``, ``flac``...). A null cell, or a null struct, means
  the sample lacks that field. Any other type (nested structs, maps, lists of strings) is an
  :class:`UnusableColumnError` naming the column.
* **Splits.** Each file's split comes from its name or folder (:mod:`.parquet_layout`); the pack keeps
  them unless asked to split by key hash.

The files are read in pieces, runs of row groups, by the pack's workers (:func:`read_table_piece`), as a
Parquet file list is; this process reads only the footers, then merges the pieces in order. The result
depends only on the files and the options, not on the cutting: a row's number in a message is its row
in its file.
"""

from __future__ import annotations

import io
from collections.abc import Generator, Mapping
from concurrent.futures import Executor
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardpipe.errors import DataError, UsageError
from shardpipe.sources.file_list import group_runs
from shardpipe.sources.hf_features import (
    card_dataset_info,
    class_names_from_card,
    class_names_from_schema,
    features_from_schema,
)
from shardpipe.sources.list_piece import ListSource, open_parquet
from shardpipe.sources.parquet_layout import ordered_splits, split_of
from shardpipe.sources.table import Grouped
from shardpipe.storage import is_remote, redact_url

KEY_DIGITS = 10
"""Digits of a positional key: any split of fewer than ten billion rows keeps keys that sort in row order."""
PIECE_BYTES = 8 << 20
"""Compressed row-group bytes per read task, as for a Parquet file list (whole row groups per task)."""
_MAGIC = (
    (b"\xff\xd8\xff", "jpg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF87a", "gif"), (b"GIF89a", "gif"),
    (b"fLaC", "flac"), (b"OggS", "ogg"), (b"ID3", "mp3"), (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"),
    (b"BM", "bmp"),
)  # fmt: skip
_RIFF = {b"WEBP": "webp", b"WAVE": "wav", b"AVI ": "avi"}


class UnusableColumnError(UsageError):
    """A column whose type cannot become a field; ``column`` names it (leaving it out is the fix), and
    ``problem`` is the message without the fix (the CLI gives the flag instead)."""

    def __init__(self, message: str, *, column: str = "", problem: str = "") -> None:
        super().__init__(message)
        self.column, self.problem = column, problem or message

    @classmethod
    def of(cls, problem: str, column: str) -> UnusableColumnError:
        message = f"{problem}; leave it out with field_map={{{column!r}: ''}}"
        return cls(message, column=column, problem=problem)


@dataclass(frozen=True, slots=True)
class ColumnRule:
    """How one column becomes a field."""

    column: str
    kind: str
    """``bytes``, ``text``, ``integer``, ``value`` (other scalars), ``blob`` ({bytes, path}) or ``array``."""
    field: str | None
    """The field's name; None for a blob named row by row by its path (or its bytes' signature)."""
    dtype: str = ""
    """An array's numpy dtype."""


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


def read_footer(relpath: str, location: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """``(TableFile, schema without metadata, schema metadata)`` of one file, from its footer only."""
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
    found = TableFile(relpath, location, split_of(relpath), tuple(rows), tuple(sizes))
    return found, schema.remove_metadata(), schema.metadata


def is_parquet_table(location: str, storage_options: Mapping[str, Any] | None) -> bool:
    """Whether a ``.parquet`` file is a dataset of its own (no ``key`` column, or written by ``datasets``)
    rather than a file list of paths with a ``key`` column."""
    _, schema, metadata = read_footer(location.rsplit("/", 1)[-1], location, storage_options)
    return "key" not in schema.names or features_from_schema(metadata) is not None


def column_rules(
    schema: Any, shown: str, field_map: Mapping[str, str], key_column: str | None
) -> tuple[ColumnRule, ...]:
    """Each kept column's rule (see the module docstring), checked: every column usable, names valid and
    distinct, the mapping and the key column naming columns that exist."""
    names = list(schema.names)
    unknown = sorted(set(field_map) - set(names))
    if unknown:
        raise UsageError(
            f"the field mapping names {', '.join(map(repr, unknown))}, not columns of {shown} "
            f"(columns: {', '.join(names)})"
        )
    if key_column is not None:
        if key_column not in names:
            raise UsageError(
                f"key column {key_column!r} is not a column of {shown} (columns: {', '.join(names)})"
            )
        kind, _ = _kind(schema.field(key_column).type)
        if kind not in ("text", "integer"):
            raise UsageError(
                f"key column {key_column!r} of {shown} is {schema.field(key_column).type}; a key column "
                "holds strings or integers"
            )
    rules: list[ColumnRule] = []
    for name in names:
        if name == key_column or field_map.get(name) == "":
            continue
        arrow_type = schema.field(name).type
        kind, dtype = _kind(arrow_type)
        if kind is None:
            raise UnusableColumnError.of(
                f"column {name!r} of {shown} is {arrow_type}, which cannot become a field (binary, string, "
                "number, boolean, a list of numbers or a {bytes, path} struct can)",
                name,
            )
        default = f"{name}.npy" if kind == "array" else None if kind == "blob" else name
        rules.append(ColumnRule(name, kind, field_map.get(name, default), dtype))
    for rule in rules:
        if rule.field is not None:
            _check_field_name(rule.field, rule.column)
    named = [rule.field for rule in rules if rule.field is not None]
    twice = sorted({name for name in named if named.count(name) > 1})
    if twice:
        raise UsageError(f"several columns of {shown} map to the field {twice[0]!r}; give each its own name")
    if not rules:
        raise UsageError(f"no column of {shown} is left to become a field")
    return tuple(rules)


def _check_field_name(name: str, column: str) -> None:
    if not name or "/" in name or "\0" in name or name.startswith("__"):
        raise UsageError(
            f"column {column!r} would become field {name!r}, but a field name must be non-empty, hold no "
            f"'/' and not start with '__'; name it with the field mapping {column}=NAME, or leave it out "
            f"with {column}="
        )


def _kind(arrow_type: Any) -> tuple[str | None, str]:
    """``(kind, numpy dtype of an array)`` of a column type; ``(None, "")`` when no field can hold it."""
    import pyarrow.types as t

    if t.is_dictionary(arrow_type):  # a pandas categorical, say: its values decide
        return _kind(arrow_type.value_type)
    if t.is_binary(arrow_type) or t.is_large_binary(arrow_type) or t.is_fixed_size_binary(arrow_type):
        return "bytes", ""
    if t.is_string(arrow_type) or t.is_large_string(arrow_type):
        return "text", ""
    if t.is_integer(arrow_type):
        return "integer", ""
    if (
        t.is_boolean(arrow_type)
        or t.is_floating(arrow_type)
        or t.is_decimal(arrow_type)
        or t.is_temporal(arrow_type)
    ):
        return "value", ""
    if t.is_struct(arrow_type):
        members = {arrow_type.field(i).name: arrow_type.field(i).type for i in range(arrow_type.num_fields)}
        binary = members.get("bytes")
        path = members.get("path")
        if (
            set(members) == {"bytes", "path"}
            and (t.is_binary(binary) or t.is_large_binary(binary))
            and (t.is_string(path) or t.is_large_string(path))
        ):
            return "blob", ""
        return None, ""
    leaf = arrow_type
    while t.is_list(leaf) or t.is_large_list(leaf) or t.is_fixed_size_list(leaf):
        leaf = leaf.value_type
    if leaf is not arrow_type and (t.is_integer(leaf) or t.is_floating(leaf) or t.is_boolean(leaf)):
        return "array", str(np.dtype(leaf.to_pandas_dtype()))
    return None, ""


def read_table_piece(piece: TablePiece) -> TablePieceRows:
    """Read one piece's rows and turn each kept column into field cells; a bad row raises, named by its
    file and row."""
    import pyarrow as pa

    source = ListSource(piece.file.location, "parquet", storage_options=piece.storage_options)
    wanted = [rule.column for rule in piece.rules] + ([piece.key_column] if piece.key_column else [])
    try:
        with open_parquet(source) as parquet:
            table = parquet.read_row_groups(list(range(*piece.groups)), columns=wanted)
    except (OSError, ValueError) as exc:
        raise DataError(
            f"cannot read Parquet file {piece.file.shown} "
            f"(row groups {piece.groups[0]}-{piece.groups[1]}): {exc}"
        ) from exc
    where = _Where(piece.file.shown, piece.first_row)
    if piece.key_column is None:
        split, first = piece.file.split, piece.first_position
        keys = [f"{split}/{position:0{KEY_DIGITS}d}" for position in range(first, first + table.num_rows)]
    else:
        keys = _column_keys(table.column(piece.key_column), piece.key_column, where)
    names: list[str | list[str | None]] = []
    cells: list[list[bytes | None]] = []
    for rule in piece.rules:
        column = table.column(rule.column)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if rule.kind == "blob":
            found_names, values = _blobs(column, rule, where)
            names.append(found_names if rule.field is None else rule.field)
        else:
            names.append(rule.field or rule.column)
            values = _cells(column, rule, where)
        cells.append(values)
    return TablePieceRows(keys, names, cells)


@dataclass(frozen=True, slots=True)
class _Where:
    shown: str
    first_row: int

    def row(self, index: int) -> str:
        return f"{self.shown} row {self.first_row + index + 1}"


def _column_keys(column: Any, name: str, where: _Where) -> list[str]:
    from shardpipe.packing.samples import SampleError, check_key  # the rule a map's keys follow

    keys = [value if isinstance(value, str) or value is None else str(value) for value in column.to_pylist()]
    for index, key in enumerate(keys):
        try:
            check_key(key)
        except SampleError as exc:
            raise DataError(f"{where.row(index)}: key column {name!r}: {exc}") from None
    return keys  # type: ignore[return-value]


def _cells(column: Any, rule: ColumnRule, where: _Where) -> list[bytes | None]:
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


def _arrays(column: Any, rule: ColumnRule, where: _Where) -> list[bytes | None]:
    """Each row's list of numbers as ``.npy`` bytes of the column's dtype (no pickle)."""
    import pyarrow.types as t

    dtype = np.dtype(rule.dtype)
    flat = t.is_list(column.type) or t.is_large_list(column.type) or t.is_fixed_size_list(column.type)
    flat = flat and not (
        t.is_list(column.type.value_type)
        or t.is_large_list(column.type.value_type)
        or t.is_fixed_size_list(column.type.value_type)
    )
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


def _blobs(column: Any, rule: ColumnRule, where: _Where) -> tuple[list[str | None], list[bytes | None]]:
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
                    f"{where.row(index)}, column {rule.column!r}: no bytes, only the path {path!r}; a "
                    "Parquet dataset must hold its files' bytes (datasets' push_to_hub and to_parquet "
                    "embed them)"
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


def scan_parquet_dataset(
    files: list[tuple[str, str]],
    shown: str,
    *,
    readme: str | None = None,
    field_map: Mapping[str, str] | None = None,
    key_column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    pool: Executor | None = None,
) -> TableScan:
    """Scan the Parquet files ``(relative path, path or URL)`` of one dataset (``readme``: its card's text).

    The footers are read first (on ``pool`` when given): every file must have the same columns, and
    every column a usable type, before any row is read. The pieces are read on ``pool`` too."""
    field_map = dict(field_map or {})
    if pool is not None and len(files) > 1:
        footers = list(pool.map(read_footer, *zip(*files, strict=True), [storage_options] * len(files)))
    else:
        footers = [read_footer(relpath, location, storage_options) for relpath, location in files]
    first_file, schema, metadata = footers[0]
    for other, other_schema, _ in footers[1:]:
        if not other_schema.equals(schema):
            raise DataError(
                f"{other.shown} and {first_file.shown} have different columns ({other_schema.names} against "
                f"{schema.names}, or their types); a dataset's files share one schema: pack one "
                "configuration's folder at a time"
            )
    found = [footer[0] for footer in footers]
    _check_one_folder_per_split(found, shown)
    rules = column_rules(schema, first_file.shown, field_map, key_column)
    pieces = _plan(found, rules, key_column, storage_options)
    grouped: Grouped = {}
    origins: dict[str, tuple[int, int]] = {}
    producers: dict[str, str] = {}  # field -> the column it came from
    with closing(_read(pieces, pool)) as results:
        for piece, rows in zip(pieces, results, strict=True):
            _merge(piece, rows, grouped, origins, producers, found)
    features = features_from_schema(metadata)
    details: dict[str, Any] = {
        "files": len(found),
        "key": {"column": key_column}
        if key_column is not None
        else {"rule": f"{{split}}/{{position in the split:0{KEY_DIGITS}d}}"},
        "fields": {rule.column: rule.field or ",".join(sorted(f for f, c in producers.items()
                                                              if c == rule.column)) for rule in rules},
    }  # fmt: skip
    class_names: dict[str, list[str]] = {}
    if features is not None:
        details["features"], details["features_from"] = features, "parquet schema metadata (huggingface)"
        class_names = class_names_from_schema(features)
    elif readme is not None and (info := card_dataset_info(readme, _config_of(found))) is not None:
        details["features"], details["features_from"] = info.get("features"), "README.md dataset_info"
        class_names = class_names_from_card(info)
    by_field = {
        rule.field: class_names[rule.column] for rule in rules if rule.column in class_names and rule.field
    }
    if by_field:
        details["class_names"] = by_field
    classes = None
    if len(by_field) == 1 or "cls" in by_field:
        classes = tuple(by_field.get("cls") or next(iter(by_field.values())))
    splits = tuple(ordered_splits(f.split for f in found))
    return TableScan(grouped, origins, tuple(found), splits, classes, details)


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
    files: list[TableFile], rules: tuple[ColumnRule, ...], key_column: str | None,
    storage_options: Mapping[str, Any] | None,
) -> list[TablePiece]:  # fmt: skip
    """The read tasks: each file's row groups in runs of about :data:`PIECE_BYTES`, in path order, each
    knowing its first row in its file and in its split."""
    pieces: list[TablePiece] = []
    positions: dict[str, int] = {}
    for number, found in enumerate(files):
        row = 0
        for start, stop in group_runs(list(found.group_bytes), PIECE_BYTES):
            position = positions.get(found.split, 0)
            pieces.append(
                TablePiece(found, number, (start, stop), row, position, rules, key_column, storage_options)
            )
            count = sum(found.group_rows[start:stop])
            row += count
            positions[found.split] = position + count
    return pieces


def _read(pieces: list[TablePiece], pool: Executor | None) -> Generator[TablePieceRows, None, None]:
    """Each piece's rows, in piece order; read on ``pool`` (all submitted at once) or here."""
    if pool is None:
        for piece in pieces:
            yield read_table_piece(piece)
        return
    futures = [pool.submit(read_table_piece, piece) for piece in pieces]
    try:
        for future in futures:
            yield future.result()
    finally:
        for future in futures:
            future.cancel()


def _merge(
    piece: TablePiece, rows: TablePieceRows, grouped: Grouped, origins: dict[str, tuple[int, int]],
    producers: dict[str, str], files: list[TableFile],
) -> None:  # fmt: skip
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
