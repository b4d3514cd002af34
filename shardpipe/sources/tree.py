"""A directory tree as a source: a local folder, or an object-store prefix listed as one.

One rule groups files into samples wherever they live (:func:`split_key`): files sharing a key form one
sample and the extension names the field, by webdataset's own rule (the key ends at the first dot of the
file name), so that the tars we write read back the same way in webdataset. Names starting with a dot (at
any level) are skipped; a file with no dot in its name is ignored and counted. A sample's cell is the
file's path (or full URL), so the plan, the shard bytes and the order are the same for the same files
wherever they are; only the recorded paths differ.

Scanning reads metadata only; bytes are read by the pack workers. A local tree is listed folder by folder
and its files stat'ed in parallel on the pack's pool (:func:`scan_tree`); a store's listing gives every
key with its size in one call (:func:`list_tree`).
"""

from __future__ import annotations

import os
import stat
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from pathlib import Path

from shardpipe.errors import DataError, UsageError
from shardpipe.sources.table import Grouped
from shardpipe.storage import Store

LABELS = ("dirname",)
_CHUNK = 4096  # files per scan task: big enough to amortize a task, small enough to spread


def split_key(relpath: str) -> tuple[str, str] | None:
    """``"a/0001.seg.png"`` -> ``("a/0001", "seg.png")``; ``None`` when the name has no extension.

    webdataset's rule (``base_plus_ext``): the key ends at the first dot of the file name.
    """
    folder, slash, name = relpath.rpartition("/")
    base, dot, field = name.partition(".")
    return (folder + slash + base, field) if dot and base else None


def scan_tree(root: Path, *, pool: Executor | None = None) -> tuple[Grouped, int]:
    """Group the files under the local folder ``root`` by key; return the groups and ignored-file count.

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
    return grouped, ignored


ScannedChunk = tuple[Grouped, str, str, list[str], int]
"""A scanned chunk of one folder: its groups, the folder and relative folder, subfolders, ignored files."""


def scan_names(chunk: tuple[str, str, list[str]]) -> ScannedChunk:
    """Type, size and group names of one folder, by ``stat`` relative to the open folder (cheaper than
    resolving full paths); a symlink counts as what it points to."""
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
            if not name.isascii():
                _check_utf8(folder, name)
            info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                info = os.stat(name, dir_fd=folder_fd)
                if stat.S_ISDIR(info.st_mode):
                    continue  # a symlinked folder is not entered
            elif stat.S_ISDIR(info.st_mode):
                subfolders.append(name)
                continue
            parts = split_key(name)
            if parts is None:
                ignored += 1
                continue
            if parts[1] != field:
                field, samples = parts[1], grouped.setdefault(parts[1], {})
            samples[relfolder + parts[0]] = (folder + name, info.st_size)
    except OSError as exc:
        raise DataError(f"cannot read {folder}{exc.filename}: {exc.strerror}") from exc
    finally:
        os.close(folder_fd)
    return grouped, folder, relfolder, subfolders, ignored


def _check_utf8(folder: str, name: str) -> None:
    """Keys are stored as UTF-8 text (tar names, TFRecord and LMDB keys): a name that is not UTF-8 (which
    ``os.listdir`` returns with surrogate escapes) is refused, naming it, before anything is written."""
    try:
        name.encode()
    except UnicodeEncodeError:
        raw = os.fsencode(name)
        raise UsageError(
            f"{folder}{raw.decode(errors='replace')}: the name is not UTF-8 ({raw!r}); keys are stored as "
            "UTF-8, so rename it (convmv converts a tree's names) or move it out of the source"
        ) from None


def list_tree(store: Store) -> tuple[Grouped, int]:
    """Group the objects under ``store``'s root by key as :func:`scan_tree` does; cells are full URLs."""
    grouped: Grouped = {}
    ignored = 0
    for key, size in store.list_sizes().items():
        if any(part.startswith(".") for part in key.split("/")):
            continue
        parts = split_key(key)
        if parts is None:
            ignored += 1
            continue
        grouped.setdefault(parts[1], {})[parts[0]] = (store.url(key), size)
    return grouped, ignored


def add_labels(labels: str, grouped: Grouped, shown: str) -> tuple[str, ...]:
    """Add a ``cls`` field by ``labels`` (``dirname``: the index of the sample's first-level folder, in
    sorted folder order); return the class names."""
    if labels not in LABELS:
        raise UsageError(f"labels={labels!r} is not supported; the only choice is 'dirname'")
    if "cls" in grouped:
        raise DataError(
            f"labels='dirname' would overwrite the existing file {next(iter(grouped['cls'].values()))[0]!s}"
        )
    keys = {key for samples in grouped.values() for key in samples}
    top_level = sorted(key for key in keys if "/" not in key)
    if top_level:
        raise DataError(
            f"labels='dirname' needs every file inside a class folder, but {shown}/{top_level[0]}.* "
            f"(and {len(top_level) - 1} more) sit at the top level of {shown}"
        )
    classes = tuple(sorted({key.split("/", 1)[0] for key in keys}))
    class_index = {name: (str(i).encode(), len(str(i))) for i, name in enumerate(classes)}
    grouped["cls"] = {key: class_index[key.split("/", 1)[0]] for key in keys}
    return classes
