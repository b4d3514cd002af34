"""Scanning a source into a :class:`~shardpipe.sources.table.SampleTable`: a tree or a file list, wherever
it lives, every sample checked to have the same fields."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import Executor
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from shardpipe.errors import DataError, UsageError
from shardpipe.sources.file_list import scan_file_list
from shardpipe.sources.list_piece import KINDS
from shardpipe.sources.table import Grouped, SampleTable, Scan
from shardpipe.sources.tree import add_labels, list_tree, scan_tree
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
) -> Scan:
    """Scan a tree or file list into a table of samples, checking that every sample has the same fields.

    ``src`` is a path or a URL: a file list when it is a file (a URL: when its name ends like a list,
    ``.csv``, ``.jsonl``, ``.parquet``...), else a tree.
    """
    if is_remote(src):
        src = str(src)
        is_tree, shown = not names_a_list(src), redact_url(src)
    else:
        src = Path(src)
        if not src.exists():
            raise DataError(f"source {src} does not exist")
        is_tree, shown = src.is_dir(), str(src)
    if not is_tree and labels is not None:
        raise UsageError("labels apply to a directory tree; a file list carries its own label column")
    classes, ignored = None, 0
    if is_tree:
        store = open_store(src, storage_options=storage_options)
        root = store.local_path()
        grouped, ignored = list_tree(store) if root is None else scan_tree(root, pool=pool)
        if labels is not None:
            classes = add_labels(labels, grouped, shown)
    else:
        grouped = scan_file_list(
            src, literal_fields=literal_fields, storage_options=storage_options, pool=pool
        )
    table, skipped = _table(grouped, shown, skip_incomplete)
    return Scan(table, classes, skipped, ignored, "tree" if is_tree else "list")


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
