"""Sample sources: a directory tree, or a file list (CSV, JSON Lines, Parquet).

A sample is a key plus named fields. In a tree, files sharing a key form one sample and the extension
names the field, by webdataset's own rule (the key ends at the first dot of the file name), so that the
tars we write read back the same way in webdataset. Scanning reads metadata only; bytes are read by the
pack workers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardpipe.errors import DataError, UsageError

# webdataset.tariterators.base_plus_ext: key = everything up to the first dot of the last path component.
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


@dataclass(frozen=True, slots=True)
class SampleSource:
    """Where a sample's fields come from: a file path (``str``) or literal bytes, per field."""

    key: str
    fields: dict[str, str | bytes]
    num_bytes: int


@dataclass(frozen=True, slots=True)
class Scan:
    samples: list[SampleSource]
    fields: tuple[str, ...]
    classes: tuple[str, ...] | None
    num_skipped_incomplete: int
    num_ignored_files: int


def split_key(relpath: str) -> tuple[str, str] | None:
    """``"a/0001.seg.png"`` -> ``("a/0001", "seg.png")``; ``None`` when the name has no extension."""
    match = _KEY_EXT.match(relpath)
    return (match.group(1), match.group(2)) if match else None


def scan_tree(
    root: Path, *, labels: str | None = None
) -> tuple[list[SampleSource], tuple[str, ...] | None, int]:
    """Group the files under ``root`` into samples; return samples, class names, ignored-file count."""
    grouped: dict[str, dict[str, str | bytes]] = {}
    sizes: dict[str, int] = {}
    ignored = 0
    # A walk by hand with string prefixes: os.walk + os.path.relpath cost ~40 us per file, several times
    # the syscalls themselves.
    base = str(root)
    for path, relpath in _walk_files(base if base.endswith("/") else base + "/", ""):
        parts = split_key(relpath)
        if parts is None:
            ignored += 1
            continue
        key, field = parts
        try:
            size = os.stat(path).st_size
        except OSError as exc:
            raise DataError(f"cannot read {path}: {exc.strerror}") from exc
        grouped.setdefault(key, {})[field] = path
        sizes[key] = sizes.get(key, 0) + size
    classes = None
    if labels == "dirname":
        classes = _add_dirname_labels(root, grouped, sizes)
    elif labels is not None:
        raise UsageError(f"--labels {labels!r} is not supported; the only choice is 'dirname'")
    samples = [SampleSource(key, grouped[key], sizes[key]) for key in sorted(grouped)]
    return samples, classes, ignored


def _walk_files(prefix: str, relprefix: str) -> Iterator[tuple[str, str]]:
    """Yield ``(path, relative path)`` of the files under ``prefix``: its files, then subfolders, sorted.

    Same selection as ``os.walk`` without following links: hidden names are skipped, symlinked
    directories are not entered, unreadable directories are passed over.
    """
    try:
        with os.scandir(prefix) as it:
            entries = sorted((e.name, e.is_dir(), e.is_symlink()) for e in it if e.name[0] != ".")
    except OSError:
        return
    for name, _, _ in (e for e in entries if not e[1]):
        yield prefix + name, relprefix + name
    for name, _, _ in (e for e in entries if e[1] and not e[2]):
        yield from _walk_files(f"{prefix}{name}/", f"{relprefix}{name}/")


def _add_dirname_labels(
    root: Path, grouped: dict[str, dict[str, str | bytes]], sizes: dict[str, int]
) -> tuple[str, ...]:
    top_level = [key for key in grouped if "/" not in key]
    if top_level:
        raise DataError(
            f"--labels dirname needs every file inside a class folder, but {root / top_level[0]}.* "
            f"(and {len(top_level) - 1} more) sit at the top level of {root}"
        )
    classes = tuple(sorted({key.split("/", 1)[0] for key in grouped}))
    class_index = {name: str(i).encode() for i, name in enumerate(classes)}
    for key, fields in grouped.items():
        if "cls" in fields:
            raise DataError(f"--labels dirname would overwrite the existing file {fields['cls']!s}")
        label = class_index[key.split("/", 1)[0]]
        fields["cls"] = label
        sizes[key] += len(label)
    return classes


def scan_file_list(list_path: Path, *, literal_fields: Iterable[str] = ()) -> list[SampleSource]:
    """Read a CSV / JSON Lines / Parquet list with a ``key`` column and one column per field.

    String cells are file paths (relative to the list's folder) unless the column is in
    ``literal_fields``; numbers and booleans are stored as their decimal text; empty cells mean the
    sample lacks that field.
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
    rows = table.to_pylist()
    samples = []
    for row_index, row in enumerate(rows):
        key = row.pop("key")
        if not isinstance(key, str) or not key:
            raise DataError(f"{list_path} row {row_index + 1}: 'key' must be a non-empty string, got {key!r}")
        fields: dict[str, str | bytes] = {}
        num_bytes = 0
        for name, value in row.items():
            if value is None:
                continue
            if isinstance(value, str) and name not in literal:
                path = str(base / value)
                try:
                    num_bytes += os.stat(path).st_size
                except OSError as exc:
                    raise DataError(
                        f"{list_path} row {row_index + 1} ({key}), field {name!r}: cannot read {path}: "
                        f"{exc.strerror}"
                    ) from exc
                fields[name] = path
            else:
                data = _literal_bytes(value)
                fields[name] = data
                num_bytes += len(data)
        samples.append(SampleSource(key, fields, num_bytes))
    return samples


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
    """Scan a tree or file list into samples, checking that every sample has the same fields."""
    if not src.exists():
        raise DataError(f"source {src} does not exist")
    classes = None
    ignored = 0
    if src.is_dir():
        samples, classes, ignored = scan_tree(src, labels=labels)
    else:
        if labels is not None:
            raise UsageError("--labels applies to a directory tree; a file list carries its own label column")
        samples = scan_file_list(src, literal_fields=literal_fields)
        _check_unique_keys(src, samples)
    if not samples:
        raise DataError(f"source {src} holds no samples (files named <key>.<field>, e.g. 0001.jpg)")
    fields = tuple(sorted({name for s in samples for name in s.fields}))
    complete = [s for s in samples if len(s.fields) == len(fields)]
    skipped = len(samples) - len(complete)
    if skipped and not skip_incomplete:
        example = next(s for s in samples if len(s.fields) != len(fields))
        missing = sorted(set(fields) - set(example.fields))
        raise DataError(
            f"{skipped} sample(s) lack fields the others have, e.g. {example.key!r} has no "
            f"{', '.join(missing)}; fix the source or pass --skip-incomplete to leave them out"
        )
    if not complete:
        raise DataError(f"no sample in {src} has all fields {', '.join(fields)}")
    return Scan(complete, fields, classes, skipped, ignored)


def _check_unique_keys(src: Path, samples: list[SampleSource]) -> None:
    seen: set[str] = set()
    for sample in samples:
        if sample.key in seen:
            raise DataError(f"{src}: key {sample.key!r} appears more than once; keys must be unique")
        seen.add(sample.key)
    samples.sort(key=lambda s: s.key)
