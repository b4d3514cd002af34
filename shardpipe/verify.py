"""``shardpipe verify``: recompute everything the manifest claims and list every disagreement.

Per shard: size, sha256, every record parsed (and, for LMDB, each record's checksum checked), the sample
count, and, for formats with an index, the index's sha256 and every entry recomputed from the shard,
sample checksums included.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardpipe.errors import DataError
from shardpipe.formats import Format, get_format
from shardpipe.formats.layout import CHECKSUM, SampleLayout, ShardIndex, shard_checksums
from shardpipe.manifest import Manifest, ShardEntry, load_manifest, sha256_file
from shardpipe.progress import Progress


def verify(root: Path, *, quiet: bool = False) -> list[str]:
    """Return one line per problem (file and position); an empty list means the dataset is sound.

    Raises :class:`DataError` when the manifest itself cannot be read.
    """
    manifest = load_manifest(root)
    root = root if root.is_dir() else root.parent
    fmt = get_format(manifest.format)
    shards = [s for split in manifest.splits.values() for s in split]
    progress = Progress("verify", sum(s.num_samples for s in shards), quiet=quiet)
    problems: list[str] = []
    for entry in shards:
        try:
            problems += _verify_shard(root, entry, fmt, manifest)
        except OSError as exc:
            problems.append(f"{entry.path}: cannot read: {exc}")
        progress.update(entry.num_samples, entry.num_bytes)
    progress.close()
    return problems


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
