"""``shardpipe verify``: recompute everything the manifest claims and list every disagreement.

Per shard: size, sha256, every record parsed (and, for LMDB, each record's checksum checked), the sample
count, and, for formats with an index, the index's sha256 and every entry recomputed from the shard,
sample checksums included.

A dataset at a URL is checked the same way: each shard and its index are fetched into a temporary folder
(one shard at a time, deleted after), and problems name the object's URL.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

import numpy as np

from shardpipe.errors import DataError
from shardpipe.formats import Format, get_format
from shardpipe.formats.layout import CHECKSUM, SampleLayout, ShardIndex, shard_checksums
from shardpipe.manifest import Manifest, ShardEntry, load_manifest, sha256_file
from shardpipe.progress import Progress
from shardpipe.remote_manifest import manifest_location
from shardpipe.storage import ObjectNotFoundError, Store, as_location, download, is_remote


def verify(
    root: Path | str, *, quiet: bool = False, storage_options: Mapping[str, Any] | None = None
) -> list[str]:
    """Return one line per problem (file and position); an empty list means the dataset is sound.

    ``root`` is a dataset folder or manifest, a path or a URL. Raises :class:`DataError` when the
    manifest itself cannot be read.
    """
    manifest = load_manifest(root, storage_options)
    fmt = get_format(manifest.format)
    if is_remote(root):
        store, _ = manifest_location(str(root), storage_options)
        return _verify_all(manifest, lambda entry: _verify_remote(store, entry, fmt, manifest), quiet)
    root = Path(as_location(root))
    local = root if root.is_dir() else root.parent
    return _verify_all(manifest, lambda entry: _verify_shard(local, entry, fmt, manifest), quiet)


def _verify_all(manifest: Manifest, check: Callable[[ShardEntry], list[str]], quiet: bool) -> list[str]:
    shards = [s for split in manifest.splits.values() for s in split]
    progress = Progress("verify", sum(s.num_samples for s in shards), quiet=quiet)
    problems: list[str] = []
    for entry in shards:
        try:
            problems += check(entry)
        except OSError as exc:
            problems.append(f"{entry.path}: cannot read: {exc}")
        progress.update(entry.num_samples, entry.num_bytes)
    progress.close()
    return problems


def _verify_remote(store: Store, entry: ShardEntry, fmt: Format, manifest: Manifest) -> list[str]:
    """:func:`_verify_shard` on a fetched copy; the copy's folder is replaced by the URL in messages."""
    with tempfile.TemporaryDirectory(prefix="shardpipe-verify-") as folder:
        for key in (entry.path, entry.index_path):
            if key is not None:
                with suppress(ObjectNotFoundError):  # reported as missing by the check below
                    download(store, key, Path(folder, key))
        problems = _verify_shard(Path(folder), entry, fmt, manifest)
    return [line.replace(folder, store.display) for line in problems]


def _verify_shard(root: Path, entry: ShardEntry, fmt: Format, manifest: Manifest) -> list[str]:
    path = root / entry.path
    if not path.is_file():
        return [f"{entry.path}: missing"]
    problems = []
    size = path.stat().st_size
    if size != entry.num_bytes:
        problems.append(f"{entry.path}: {size:,} bytes, manifest says {entry.num_bytes:,}")
    if sha256_file(path) != entry.sha256:
        problems.append(f"{entry.path}: sha256 differs from the manifest (content changed or corrupt)")
    try:
        keys, layouts, end = fmt.scan(path)
    except DataError as exc:
        return [*problems, str(exc)]
    if len(keys) != entry.num_samples:
        problems.append(f"{entry.path}: {len(keys):,} samples, manifest says {entry.num_samples:,}")
    extra = {name for sample in layouts for name in sample.fields} - set(manifest.fields)
    if extra:
        problems.append(f"{entry.path}: fields {sorted(extra)} are not in the manifest")
    elif entry.index_path is not None:
        problems += _verify_index(root, entry, path, layouts, end, manifest)
    return problems


def _verify_index(
    root: Path, entry: ShardEntry, path: Path, layouts: list[SampleLayout], end: int, manifest: Manifest
) -> list[str]:
    index = root / str(entry.index_path)
    if not index.is_file():
        return [f"{entry.index_path}: missing"]
    problems = []
    if sha256_file(index) != entry.index_sha256:
        problems.append(f"{entry.index_path}: sha256 differs from the manifest")
    try:
        stored = ShardIndex.read(index, entry.num_samples, manifest.fields, version=manifest.index_version)
    except DataError as exc:
        return [*problems, str(exc)]
    checksums = None
    if manifest.index_version >= 2:
        checksums = shard_checksums(path, layouts, end)
    expected = ShardIndex.build(layouts, end, manifest.fields, checksums)
    if stored != expected:
        if len(stored) != len(expected):
            problems.append(
                f"{entry.index_path}: {len(stored) - 1} entries, the shard holds {len(expected) - 1}"
            )
            return problems
        differs = stored.table != expected.table  # (samples + 1, columns)
        row = int(np.flatnonzero(differs.any(axis=1))[0])
        only_checksum = checksums is not None and not np.delete(differs[row], CHECKSUM).any()
        what = "bytes differ from its checksum" if only_checksum else "entry disagrees with the shard"
        problems.append(f"{entry.index_path}: sample {row}'s {what}")
    return problems
