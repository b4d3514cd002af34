"""``shardpipe verify``: recompute everything the manifest claims and list every disagreement."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardpipe.errors import DataError
from shardpipe.formats import Format, get_format
from shardpipe.formats.layout import SampleLayout, ShardIndex
from shardpipe.manifest import ShardEntry, load_manifest, sha256_file
from shardpipe.progress import Progress


def verify(root: Path, *, quiet: bool = False) -> list[str]:
    """Return one line per problem (file and position); an empty list means the dataset is sound."""
    manifest = load_manifest(root)
    root = root if root.is_dir() else root.parent
    fmt = get_format(manifest.format)
    shards = [s for split in manifest.splits.values() for s in split]
    progress = Progress("verify", sum(s.num_samples for s in shards), quiet=quiet)
    problems: list[str] = []
    for entry in shards:
        problems += _verify_shard(root, entry, fmt, manifest.fields)
        progress.update(entry.num_samples, entry.num_bytes)
    progress.close()
    return problems


def _verify_shard(root: Path, entry: ShardEntry, fmt: Format, fields: tuple[str, ...]) -> list[str]:
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
    extra = {name for sample in layouts for name in sample.fields} - set(fields)
    if extra:
        problems.append(f"{entry.path}: fields {sorted(extra)} are not in the manifest")
    elif entry.index_path is not None:
        problems += _verify_index(root, entry, layouts, end, fields)
    return problems


def _verify_index(
    root: Path, entry: ShardEntry, layouts: list[SampleLayout], end: int, fields: tuple[str, ...]
) -> list[str]:
    index = root / str(entry.index_path)
    if not index.is_file():
        return [f"{entry.index_path}: missing"]
    problems = []
    if sha256_file(index) != entry.index_sha256:
        problems.append(f"{entry.index_path}: sha256 differs from the manifest")
    try:
        stored = ShardIndex.read(index, entry.num_samples, fields)
    except DataError as exc:
        return [*problems, str(exc)]
    expected = ShardIndex.build(layouts, end, fields)
    if stored != expected:
        rows = (
            np.flatnonzero((stored.table != expected.table).any(axis=1))
            if len(stored) == len(expected)
            else [0]
        )
        problems.append(f"{entry.index_path}: entry of sample {int(rows[0])} disagrees with the shard")
    return problems
