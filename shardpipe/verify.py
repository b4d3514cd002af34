"""``shardpipe verify``: recompute everything the manifest claims and list every disagreement."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardpipe.errors import DataError
from shardpipe.formats import Format, get_format
from shardpipe.manifest import ShardEntry, load_manifest, read_index, sha256_file
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
        problems += _verify_shard(root, entry, fmt, set(manifest.fields))
        progress.update(entry.num_samples, entry.num_bytes)
    progress.close()
    return problems


def _verify_shard(root: Path, entry: ShardEntry, fmt: Format, fields: set[str]) -> list[str]:
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
        keys, offsets, shard_fields = fmt.scan(path)
    except DataError as exc:
        return [*problems, str(exc)]
    if len(keys) != entry.num_samples:
        problems.append(f"{entry.path}: {len(keys):,} samples, manifest says {entry.num_samples:,}")
    if not shard_fields <= fields:
        problems.append(f"{entry.path}: fields {sorted(shard_fields - fields)} are not in the manifest")
    if entry.index_path is not None:
        problems += _verify_index(root, entry, offsets)
    return problems


def _verify_index(root: Path, entry: ShardEntry, offsets: list[int]) -> list[str]:
    index = root / str(entry.index_path)
    if not index.is_file():
        return [f"{entry.index_path}: missing"]
    problems = []
    if sha256_file(index) != entry.index_sha256:
        problems.append(f"{entry.index_path}: sha256 differs from the manifest")
    try:
        stored = read_index(index, entry.num_samples)
    except DataError as exc:
        return [*problems, str(exc)]
    if len(stored) != len(offsets) or not np.array_equal(stored, np.asarray(offsets, dtype=stored.dtype)):
        mismatch = next(
            (i for i, (a, b) in enumerate(zip(stored.tolist(), offsets, strict=False)) if a != b),
            len(offsets),
        )
        problems.append(f"{entry.index_path}: offset of sample {mismatch} disagrees with the shard")
    return problems
