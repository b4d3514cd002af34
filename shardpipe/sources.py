"""Sample sources: a directory tree, or a file list (CSV, JSON Lines, Parquet).

A sample is a key plus named fields. In a tree, files sharing a key form one sample and the extension
names the field, by webdataset's own rule (the key ends at the first dot of the file name), so that the
tars we write read back the same way in webdataset. Scanning reads metadata only; bytes are read by the
pack workers.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from shardpipe.errors import DataError, UsageError
from shardpipe.remote_source import list_tree
from shardpipe.storage import is_remote


@dataclass(frozen=True, slots=True)
class SampleTable:
    """Samples as columns, one row per sample (in key order as scanned; the plan may reorder them).

    Columns rather than one object per sample, because the pack stage splits, cuts, hashes and sends the
    samples to worker processes: a list of strings pickles in one C loop, a list of objects does not.
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
        """The samples at ``rows`` (a slice, or a list of indices in the order wanted), as a table."""
        if isinstance(rows, slice):
            return SampleTable(
                self.keys[rows], self.fields, [c[rows] for c in self.columns], self.sizes[rows]
            )
        columns = [[column[i] for i in rows] for column in self.columns]
        return SampleTable([self.keys[i] for i in rows], self.fields, columns, self.sizes[rows])


class IncompleteSamplesError(DataError):
    """Some samples lack a field the others have, and the scan was not asked to skip them."""


@dataclass(frozen=True, slots=True)
class Scan:
    table: SampleTable
    classes: tuple[str, ...] | None
    num_skipped_incomplete: int
    num_ignored_files: int
    kind: str = "tree"
    """``tree`` or ``list``, as the manifest records the source."""


Grouped = dict[str, dict[str, tuple[str | bytes, int]]]
"""field -> key -> (file path or literal bytes, size), as a source is read: field-major, because a
dataset has a few fields and many keys (no dict per sample)."""

_CHUNK = 4096  # files per scan task: big enough to amortize a task, small enough to spread


def scan_tree(
    root: Path, *, labels: str | None = None, pool: Executor | None = None
) -> tuple[Grouped, tuple[str, ...] | None, int]:
    """Group the files under ``root`` by key; return the groups, class names and ignored-file count.

    This process only lists folders (``os.listdir``, no per-entry Python); chunks of names are typed,
    sized and grouped by :func:`scan_names`, on ``pool`` when given: the ``stat`` calls are most of a
    scan, and a pool spreads them over the pack's workers while this process merges finished chunks
    and lists the subfolders they report. Like ``os.walk``: hidden names are skipped, symlinked folders
    are not entered, unreadable folders are passed over.
    """
    grouped: Grouped = {}
    ignored = 0
    pending: set[Future[ScannedChunk]] = set()

    def merge(scanned: ScannedChunk) -> None:
        nonlocal ignored
        chunk_grouped, folder, relfolder, subfolders, chunk_ignored = scanned
        for field, samples in chunk_grouped.items():
            grouped.setdefault(field, {}).update(samples)
        ignored += chunk_ignored
        for name in subfolders:
            visit(f"{folder}{name}/", f"{relfolder}{name}/")

    def visit(folder: str, relfolder: str) -> None:
        try:
            names = [name for name in os.listdir(folder) if name[0] != "."]
        except OSError:
            return
        for i in range(0, len(names), _CHUNK):
            chunk = (folder, relfolder, names[i : i + _CHUNK])
            if pool is None:
                merge(scan_names(chunk))
            else:
                pending.add(pool.submit(scan_names, chunk))

    base = str(root)
    visit(base if base.endswith("/") else base + "/", "")
    while pending:
        done, _ = wait(pending, return_when=FIRST_COMPLETED)
        for future in done:
            pending.remove(future)
            merge(future.result())
    classes = None
    if labels == "dirname":
        classes = _add_dirname_labels(root, grouped)
    elif labels is not None:
        raise UsageError(f"labels={labels!r} is not supported; the only choice is 'dirname'")
    return grouped, classes, ignored


ScannedChunk = tuple[Grouped, str, str, list[str], int]
"""A scanned chunk of one folder: its groups, the folder and relative folder, subfolders, ignored files."""


def scan_names(chunk: tuple[str, str, list[str]]) -> ScannedChunk:
    """Type, size and group names of one folder, by ``stat`` relative to the open folder (cheaper than
    resolving full paths). A file's key is the relative folder plus its name up to the first dot
    (``shardpipe.split.split_key``); a file with no dot is ignored; a symlink counts as what it points to."""
    folder, relfolder, names = chunk
    names = sorted(names)  # keys come back in sorted runs, which the final sort merges cheaply
    grouped: Grouped = {}
    subfolders: list[str] = []
    ignored = 0
    field, samples = "", {}  # the field seen last: a folder's files mostly share one
    try:
        folder_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return grouped, folder, relfolder, subfolders, ignored  # vanished or unreadable: passed over
    try:
        for name in names:
            info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                info = os.stat(name, dir_fd=folder_fd)
                if stat.S_ISDIR(info.st_mode):
                    continue  # a symlinked folder is not entered
            elif stat.S_ISDIR(info.st_mode):
                subfolders.append(name)
                continue
            stem, dot, name_field = name.partition(".")  # never hidden: the stem is set
            if not dot:
                ignored += 1
                continue
            if name_field != field:
                field, samples = name_field, grouped.setdefault(name_field, {})
            samples[relfolder + stem] = (folder + name, info.st_size)
    except OSError as exc:
        raise DataError(f"cannot read {folder}{exc.filename}: {exc.strerror}") from exc
    finally:
        os.close(folder_fd)
    return grouped, folder, relfolder, subfolders, ignored


def _add_dirname_labels(root: Path | str, grouped: Grouped) -> tuple[str, ...]:
    if "cls" in grouped:
        raise DataError(
            f"labels='dirname' would overwrite the existing file {next(iter(grouped['cls'].values()))[0]!s}"
        )
    keys = {key for samples in grouped.values() for key in samples}
    top_level = sorted(key for key in keys if "/" not in key)
    if top_level:
        raise DataError(
            f"labels='dirname' needs every file inside a class folder, but {root}/{top_level[0]}.* "
            f"(and {len(top_level) - 1} more) sit at the top level of {root}"
        )
    classes = tuple(sorted({key.split("/", 1)[0] for key in keys}))
    class_index = {name: (str(i).encode(), len(str(i))) for i, name in enumerate(classes)}
    grouped["cls"] = {key: class_index[key.split("/", 1)[0]] for key in keys}
    return classes


LIST_SUFFIXES = (".csv", ".jsonl", ".ndjson", ".json", ".parquet", ".pq")


def names_a_list(url: str) -> bool:
    """A remote SRC is a file list when its last part ends like one (query string left out)."""
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return any(name.lower().endswith(suffix) for suffix in LIST_SUFFIXES)


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

    ``src`` may be a URL: a file list when its name ends like one (``.csv``, ``.jsonl``, ``.parquet``...),
    else a prefix listed as a tree.
    """
    classes = None
    ignored = 0
    if is_remote(src):
        src = str(src)
        is_tree = not names_a_list(src)
    else:
        src = Path(src)
        if not src.exists():
            raise DataError(f"source {src} does not exist")
        is_tree = src.is_dir()
    if not is_tree and labels is not None:
        raise UsageError("labels apply to a directory tree; a file list carries its own label column")
    if is_tree and isinstance(src, str):
        grouped, ignored, shown = list_tree(src, storage_options)
        if labels == "dirname":
            classes = _add_dirname_labels(shown, grouped)
        elif labels is not None:
            raise UsageError(f"labels={labels!r} is not supported; the only choice is 'dirname'")
        src = shown  # messages below name the source: never with credentials
    elif is_tree and isinstance(src, Path):
        grouped, classes, ignored = scan_tree(src, labels=labels, pool=pool)
    else:
        from shardpipe.file_list import scan_file_list  # a list needs pyarrow; a tree does not

        grouped = scan_file_list(
            src, literal_fields=literal_fields, storage_options=storage_options, pool=pool
        )
    if not grouped:
        raise DataError(f"source {src} holds no samples (files named <key>.<field>, e.g. 0001.jpg)")
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
        raise DataError(f"no sample in {src} has all fields {', '.join(fields)}")
    columns, sizes = [], np.empty((len(keys), len(fields)), dtype=np.int64)
    for j, name in enumerate(fields):
        cells = [grouped[name][keys[0]]] if len(keys) == 1 else itemgetter(*keys)(grouped[name])
        columns.append(list(map(itemgetter(0), cells)))
        sizes[:, j] = list(map(itemgetter(1), cells))
    table = SampleTable(keys, fields, columns, sizes)
    return Scan(table, classes, skipped, ignored, "tree" if is_tree else "list")
