"""Scanning a source into a :class:`~shardpipe.sources.table.SampleTable`: a tree, a file list or a Parquet
dataset, wherever it lives, every sample checked to have the same fields.

Which one a source is: a folder (or an object-store prefix) is a tree, unless its files are Parquet
files and side files only (:func:`~shardpipe.sources.parquet_layout.parquet_files`): then a Parquet
dataset; or Arrow files and JSON side files, as ``datasets``' ``save_to_disk`` writes them: read as a
Parquet dataset is. A ``.parquet`` file is a file list when it has a ``key`` column and no features
written by Hugging Face's ``datasets``, else a Parquet dataset of its own; an ``.arrow`` file is a dataset
of its own; ``.csv`` and ``.jsonl`` files are lists.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from concurrent.futures import Executor
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from shardpipe.errors import DataError, UsageError
from shardpipe.sources.arrow_files import is_arrow
from shardpipe.sources.file_list import scan_file_list
from shardpipe.sources.list_piece import KINDS, list_kind
from shardpipe.sources.parquet_layout import parquet_files, readme_cell
from shardpipe.sources.parquet_table import TableScan, is_parquet_table, scan_parquet_dataset
from shardpipe.sources.table import Grouped, SampleTable, Scan
from shardpipe.sources.tree import add_labels, list_tree, scan_tree
from shardpipe.sources.urls import Stores
from shardpipe.storage import is_remote, open_store, redact_url


class IncompleteSamplesError(DataError):
    """Some samples lack a field the others have, and the scan was not asked to skip them."""


def names_a_list(location: str) -> bool:
    """A source is a file list when its last part ends like one (a URL's query string left out)."""
    name = location.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return any(name.lower().endswith(suffix) for suffix in KINDS)


def scan_source(
    src: Path | str,
    *,
    labels: str | None = None,
    literal_fields: Iterable[str] = (),
    skip_incomplete: bool = False,
    pool: Executor | None = None,
    storage_options: Mapping[str, Any] | None = None,
    key_column: str | None = None,
    field_map: Mapping[str, str] | None = None,
) -> Scan:
    """Scan a tree, file list or Parquet dataset into a table of samples, checking that every sample has
    the same fields.

    ``src`` is a path or a URL: a file list when it is a file (a URL: when its name ends like a list,
    ``.csv``, ``.jsonl``, ``.parquet``...), else a folder (see the module docstring for a Parquet one).
    ``key_column`` and ``field_map`` describe a Parquet dataset (:mod:`shardpipe.sources.parquet_table`).
    """
    src, is_tree, shown = _located(src)
    if not is_tree and labels is not None:
        raise UsageError("labels apply to a directory tree; a file list carries its own label column")
    classes, ignored = None, 0
    if is_tree:
        grouped, ignored = _list_tree(src, pool, storage_options)
        files = parquet_files(grouped)
    else:
        files = _table_file(str(src), storage_options)
    if files is not None:
        readme, top_split = _dataset_side_files(grouped, storage_options) if is_tree else (None, None)
        _refuse_file_options(labels, literal_fields)
        found = scan_parquet_dataset(
            files,
            shown,
            readme=readme,
            field_map=field_map,
            key_column=key_column,
            storage_options=storage_options,
            pool=pool,
            top_split=top_split,
        )
        return _table_scan(found, shown, skip_incomplete)
    if labels is not None:  # a tree's: a list's labels were refused above
        classes = add_labels(labels, grouped, shown)
    _refuse_dataset_options(key_column, field_map, shown, is_tree)
    if not is_tree:
        grouped = scan_file_list(
            src, literal_fields=literal_fields, storage_options=storage_options, pool=pool
        )
    table, skipped = _table(grouped, shown, skip_incomplete)
    return Scan(table, classes, skipped, ignored, "tree" if is_tree else "list")


def _located(src: Path | str) -> tuple[Path | str, bool, str]:
    """``src`` as a URL or a path that exists, whether it is a tree (a folder; a URL unless its name ends
    like a list) and how messages show it (a URL without credentials)."""
    if is_remote(src):
        url = str(src)
        return url, not names_a_list(url), redact_url(url)
    path = Path(src)
    if not path.exists():
        raise DataError(f"source {path} does not exist")
    return path, path.is_dir(), str(path)


def _list_tree(
    src: Path | str, pool: Executor | None, storage_options: Mapping[str, Any] | None
) -> tuple[Grouped, int]:
    """A tree's files by field and key, and how many were ignored: a local folder is scanned in place
    (on ``pool``), a remote one listed through its store."""
    store = open_store(src, storage_options=storage_options)
    root = store.local_path()
    return list_tree(store) if root is None else scan_tree(root, pool=pool)


def _table_file(src: str, storage_options: Mapping[str, Any] | None) -> list[tuple[str, str]] | None:
    """A file that is a dataset of its own (an Arrow file, or a Parquet file that is no list of paths)
    as the one ``(name, location)`` of a Parquet dataset; None for a file list."""
    if is_arrow(src) or (list_kind(src) == "parquet" and is_parquet_table(src, storage_options)):
        name = src.split("?", 1)[0].rsplit("/", 1)[-1]
        return [(name, src)]
    return None


def _dataset_side_files(
    grouped: Grouped, storage_options: Mapping[str, Any] | None
) -> tuple[str | None, str | None]:
    """A Parquet tree's side files: its card's text, and the split a lone saved dataset names (each None
    where there is none)."""
    cell = readme_cell(grouped)
    readme = None if cell is None else _read_text(cell, storage_options)
    return readme, _saved_split(grouped, storage_options)


def _refuse_file_options(labels: str | None, literal_fields: Iterable[str]) -> None:
    """Options that describe a tree of files or a list of paths mean nothing to a Parquet dataset."""
    if labels is not None:
        raise UsageError("labels apply to a directory tree of files; a Parquet dataset has label columns")
    if literal_fields:
        raise UsageError("literal fields describe a file list of paths; a Parquet dataset holds values")


def _refuse_dataset_options(
    key_column: str | None, field_map: Mapping[str, str] | None, shown: str, is_tree: bool
) -> None:
    """Options that describe a Parquet dataset's columns mean nothing to a tree or a file list."""
    if key_column is not None or field_map:
        what = "key column" if key_column is not None else "field mapping"
        raise UsageError(
            f"a {what} applies to a Parquet dataset; {shown} is a {'tree' if is_tree else 'file list'}"
        )


def _saved_split(grouped: Grouped, storage_options: Mapping[str, Any] | None) -> str | None:
    """The split a ``Dataset`` saved alone by ``save_to_disk`` names in its ``state.json`` (None: none)."""
    found = grouped.get("json", {}).get("state")
    text = None if found is None else _read_text(str(found[0]), storage_options)
    try:
        split = json.loads(text)["_split"] if text else None
    except (ValueError, KeyError, TypeError):
        return None
    return split if isinstance(split, str) and split else None


def _read_text(cell: str, storage_options: Mapping[str, Any] | None) -> str | None:
    """A side file's text (a dataset card), or None when it cannot be read as UTF-8."""
    try:
        data = Stores(storage_options).read(cell) if "://" in cell else Path(cell).read_bytes()
        return data.decode()
    except (OSError, DataError, UnicodeDecodeError):
        return None


def _table_scan(found: TableScan, shown: str, skip_incomplete: bool) -> Scan:
    """A Parquet dataset's samples as a table, each row knowing its file, its row and its split."""
    table, skipped = _table(found.grouped, shown, skip_incomplete)
    origins = np.array([found.origins[key] for key in table.keys], dtype=np.int64).reshape(-1, 2)
    names = tuple(f.shown for f in found.files)
    table = SampleTable(
        keys=table.keys,
        fields=table.fields,
        columns=table.columns,
        sizes=table.sizes,
        origins=origins,
        origin_files=names,
    )
    row_splits = tuple(found.files[number].split for number in origins[:, 0].tolist())
    return Scan(
        table=table,
        classes=found.classes,
        num_skipped_incomplete=skipped,
        num_ignored_files=0,
        kind="parquet",
        splits=found.splits,
        row_splits=row_splits,
        details=found.details,
    )


def _table(grouped: Grouped, shown: str, skip_incomplete: bool) -> tuple[SampleTable, int]:
    """The samples that have every field, in key order, and how many were left out."""
    if not grouped:
        raise DataError(f"source {shown} holds no samples (files named <key>.<field>, e.g. 0001.jpg)")
    fields = tuple(sorted(grouped))
    every_key = set().union(*grouped.values())
    complete = every_key.intersection(*grouped.values())
    keys = sorted(key for key in grouped[fields[0]] if key in complete)  # sorted runs: cheap to sort
    skipped = len(every_key) - len(keys)
    if skipped and not skip_incomplete:
        example = min(every_key - complete)
        missing = [name for name in fields if example not in grouped[name]]
        raise IncompleteSamplesError(
            f"{skipped} sample(s) lack fields the others have, e.g. {example!r} has no {', '.join(missing)}"
        )
    if not keys:
        raise DataError(f"no sample in {shown} has all fields {', '.join(fields)}")
    columns, sizes = [], np.empty((len(keys), len(fields)), dtype=np.int64)
    for j, name in enumerate(fields):
        cells = [grouped[name][keys[0]]] if len(keys) == 1 else itemgetter(*keys)(grouped[name])
        columns.append(list(map(itemgetter(0), cells)))
        sizes[:, j] = list(map(itemgetter(1), cells))
    return SampleTable(keys, fields, columns, sizes), skipped
