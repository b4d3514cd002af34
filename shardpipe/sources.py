"""Sample sources: a directory tree, or a file list (CSV, JSON Lines, Parquet).

A sample is a key plus named fields. In a tree, files sharing a key form one sample and the extension
names the field, by webdataset's own rule (the key ends at the first dot of the file name), so that the
tars we write read back the same way in webdataset. Scanning reads metadata only; bytes are read by the
pack workers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardpipe.errors import DataError, UsageError


@dataclass(frozen=True, slots=True)
class SampleTable:
    """Samples as columns, one row per sample in key order.

    Columns rather than one object per sample, because the pack stage splits, cuts, hashes and sends the
    samples to worker processes: a list of strings pickles in one C loop (measured 80 ms -> a few ms for a
    shard of 7,500 samples).
    """

    keys: list[str]
    fields: tuple[str, ...]
    """Field names, sorted."""
    columns: list[list[str | bytes]]
    """``columns[j][i]``: field ``fields[j]`` of sample ``i``, a file path (``str``) or literal bytes."""
    sizes: np.ndarray
    """``(num_samples, num_fields)`` int64: the bytes of each field, as scanned."""

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def num_bytes(self) -> np.ndarray:
        """Each sample's payload bytes."""
        return np.asarray(self.sizes.sum(axis=1))

    def take(self, rows: slice | list[int]) -> SampleTable:
        """The samples at ``rows`` (a slice, or ascending indices), as a table of their own."""
        if isinstance(rows, slice):
            return SampleTable(
                self.keys[rows], self.fields, [c[rows] for c in self.columns], self.sizes[rows]
            )
        columns = [[column[i] for i in rows] for column in self.columns]
        return SampleTable([self.keys[i] for i in rows], self.fields, columns, self.sizes[rows])


@dataclass(frozen=True, slots=True)
class Scan:
    table: SampleTable
    classes: tuple[str, ...] | None
    num_skipped_incomplete: int
    num_ignored_files: int


Grouped = dict[str, dict[str, tuple[str | bytes, int]]]
"""key -> field -> (file path or literal bytes, size), as a source is read."""


def split_key(relpath: str) -> tuple[str, str] | None:
    """``"a/0001.seg.png"`` -> ``("a/0001", "seg.png")``; ``None`` when the name has no extension.

    webdataset's rule (``base_plus_ext``): the key ends at the first dot of the file name.
    """
    folder, slash, name = relpath.rpartition("/")
    base, dot, field = name.partition(".")
    return (folder + slash + base, field) if dot and base else None


def scan_tree(root: Path, *, labels: str | None = None) -> tuple[Grouped, tuple[str, ...] | None, int]:
    """Group the files under ``root`` by key; return the groups, class names and ignored-file count."""
    grouped: Grouped = {}
    ignored = 0
    base = str(root)
    for folder, relfolder, names in _walk_folders(base if base.endswith("/") else base + "/", ""):
        for name, size in zip(names, _sizes(folder, names), strict=True):
            stem, dot, field = name.partition(".")  # split_key on a name (never hidden, so stem is set)
            if not dot:
                ignored += 1
                continue
            key = relfolder + stem
            sample = grouped.get(key)
            if sample is None:
                sample = grouped[key] = {}
            sample[field] = (folder + name, size)
    classes = None
    if labels == "dirname":
        classes = _add_dirname_labels(root, grouped)
    elif labels is not None:
        raise UsageError(f"--labels {labels!r} is not supported; the only choice is 'dirname'")
    return grouped, classes, ignored


def _walk_folders(prefix: str, relprefix: str) -> Iterator[tuple[str, str, list[str]]]:
    """Yield ``(folder path, relative folder path, sorted file names)`` for ``prefix`` and its subfolders.

    A walk by hand with string prefixes (``os.walk`` + ``os.path.relpath`` cost ~40 us per file, several
    times the syscalls themselves), with ``os.walk``'s selection: hidden names are skipped, symlinked
    directories are not entered, unreadable directories are passed over.
    """
    files, folders = [], []
    try:
        with os.scandir(prefix) as it:
            for entry in it:
                if entry.name[0] == ".":
                    continue
                if not entry.is_dir():
                    files.append(entry.name)
                elif not entry.is_symlink():
                    folders.append(entry.name)
    except OSError:
        return
    yield prefix, relprefix, sorted(files)
    for name in sorted(folders):
        yield from _walk_folders(f"{prefix}{name}/", f"{relprefix}{name}/")


def _sizes(folder: str, names: list[str]) -> list[int]:
    """Each file's size, by ``stat`` relative to the open folder (cheaper than resolving full paths)."""
    try:
        folder_fd = os.open(folder, os.O_RDONLY)
    except OSError as exc:
        raise DataError(f"cannot read folder {folder}: {exc.strerror}") from exc
    try:
        return [os.stat(name, dir_fd=folder_fd).st_size for name in names]
    except OSError as exc:
        raise DataError(f"cannot read {folder}{exc.filename}: {exc.strerror}") from exc
    finally:
        os.close(folder_fd)


def _add_dirname_labels(root: Path, grouped: Grouped) -> tuple[str, ...]:
    top_level = [key for key in grouped if "/" not in key]
    if top_level:
        raise DataError(
            f"--labels dirname needs every file inside a class folder, but {root / top_level[0]}.* "
            f"(and {len(top_level) - 1} more) sit at the top level of {root}"
        )
    classes = tuple(sorted({key.split("/", 1)[0] for key in grouped}))
    class_index = {name: (str(i).encode(), len(str(i))) for i, name in enumerate(classes)}
    for key, fields in grouped.items():
        if "cls" in fields:
            raise DataError(f"--labels dirname would overwrite the existing file {fields['cls'][0]!s}")
        fields["cls"] = class_index[key.split("/", 1)[0]]
    return classes


def scan_file_list(list_path: Path, *, literal_fields: Iterable[str] = ()) -> Grouped:
    """Read a CSV / JSON Lines / Parquet list with a ``key`` column and one column per field.

    String cells are file paths (relative to the list's folder) unless the column is in
    ``literal_fields``; numbers and booleans are stored as their decimal text; empty cells mean the
    sample lacks that field. Keys must be unique.
    """
    table = _read_table(list_path)
    columns = table.column_names
    if "key" not in columns:
        raise DataError(f"{list_path} has no 'key' column (found: {', '.join(columns)})")
    literal = set(literal_fields)
    unknown = literal - set(columns)
    if unknown:
        raise UsageError(f"--literal names {', '.join(sorted(unknown))}, not columns of {list_path}")
    base = list_path.parent
    grouped: Grouped = {}
    for row_index, row in enumerate(table.to_pylist()):
        key = row.pop("key")
        if not isinstance(key, str) or not key:
            raise DataError(f"{list_path} row {row_index + 1}: 'key' must be a non-empty string, got {key!r}")
        if key in grouped:
            raise DataError(f"{list_path}: key {key!r} appears more than once; keys must be unique")
        fields = grouped[key] = {}
        for name, value in row.items():
            if value is None:
                continue
            if isinstance(value, str) and name not in literal:
                path = str(base / value)
                try:
                    fields[name] = (path, os.stat(path).st_size)
                except OSError as exc:
                    raise DataError(
                        f"{list_path} row {row_index + 1} ({key}), field {name!r}: cannot read {path}: "
                        f"{exc.strerror}"
                    ) from exc
            else:
                data = _literal_bytes(value)
                fields[name] = (data, len(data))
    return grouped


def _literal_bytes(value: Any) -> bytes:
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, bytes):
        return value
    return str(value).encode()


def _read_table(path: Path) -> Any:
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
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise UsageError(f"{path}: unknown list type {path.suffix!r}; use .csv, .jsonl or .parquet")
    try:
        return reader(path)
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        raise DataError(f"cannot read file list {path}: {exc}") from exc


def scan_source(
    src: Path, *, labels: str | None = None, literal_fields: Iterable[str] = (), skip_incomplete: bool = False
) -> Scan:
    """Scan a tree or file list into a table of samples, checking that every sample has the same fields."""
    if not src.exists():
        raise DataError(f"source {src} does not exist")
    classes = None
    ignored = 0
    if src.is_dir():
        grouped, classes, ignored = scan_tree(src, labels=labels)
    else:
        if labels is not None:
            raise UsageError("--labels applies to a directory tree; a file list carries its own label column")
        grouped = scan_file_list(src, literal_fields=literal_fields)
    if not grouped:
        raise DataError(f"source {src} holds no samples (files named <key>.<field>, e.g. 0001.jpg)")
    fields = tuple(sorted({name for sample in grouped.values() for name in sample}))
    keys = sorted(key for key, sample in grouped.items() if len(sample) == len(fields))
    skipped = len(grouped) - len(keys)
    if skipped and not skip_incomplete:
        example = min(key for key, sample in grouped.items() if len(sample) != len(fields))
        missing = sorted(set(fields) - set(grouped[example]))
        raise DataError(
            f"{skipped} sample(s) lack fields the others have, e.g. {example!r} has no "
            f"{', '.join(missing)}; fix the source or pass --skip-incomplete to leave them out"
        )
    if not keys:
        raise DataError(f"no sample in {src} has all fields {', '.join(fields)}")
    cells = [[grouped[key][name] for key in keys] for name in fields]  # (fields, samples) of (value, size)
    sizes = np.array([[size for _, size in column] for column in cells], dtype=np.int64).T.reshape(
        len(keys), -1
    )
    table = SampleTable(keys, fields, [[value for value, _ in column] for column in cells], sizes)
    return Scan(table, classes, skipped, ignored)
