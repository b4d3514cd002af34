"""``shardpipe index``: adopt shards written by other tools, without repacking.

Scans webdataset tars or TFRecord files of ``tf.train.Example``, writes each one's index (spans and sample
checksums, computed now from the bytes as they are) beside it and a manifest for the folder, so the
loaders read and check them like shards shardpipe packed. Files directly in the folder form one split
(``train`` unless named); each subfolder holding shards is a split of its own.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from shardpipe.atomic import write_bytes_atomic
from shardpipe.errors import DataError, UsageError
from shardpipe.formats import get_format
from shardpipe.formats.layout import ShardIndex, shard_checksums
from shardpipe.manifest import MANIFEST_NAME, Manifest, ShardEntry, sha256_file, write_manifest
from shardpipe.progress import Progress

SUFFIXES = {".tar": "tar", ".tfrecord": "tfrecord", ".tfrecords": "tfrecord", ".tfr": "tfrecord"}


def find_shards(root: Path, top_split: str) -> dict[str, list[Path]]:
    splits: dict[str, list[Path]] = {}
    for folder, split in [(root, top_split), *((d, d.name) for d in sorted(root.iterdir()) if d.is_dir())]:
        shards = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in SUFFIXES)
        if shards:
            splits.setdefault(split, []).extend(shards)
    return splits


def index_folder(
    root: Path, *, split_name: str = "train", overwrite: bool = False, quiet: bool = False
) -> Manifest:
    if not root.is_dir():
        raise UsageError(f"{root} is not a directory")
    if (root / MANIFEST_NAME).exists() and not overwrite:
        raise UsageError(f"{root} already has a {MANIFEST_NAME}; pass --overwrite to index it again")
    splits = find_shards(root, split_name)
    if not splits:
        raise DataError(f"no shards (*{', *'.join(SUFFIXES)}) in {root} or its subfolders")
    formats = {SUFFIXES[p.suffix] for paths in splits.values() for p in paths}
    if len(formats) > 1:
        raise DataError(
            f"{root} mixes shard formats ({', '.join(sorted(formats))}); index one format per folder"
        )
    fmt = get_format(formats.pop())
    progress = Progress("index", sum(len(p) for p in splits.values()), unit="shards", quiet=quiet)
    scanned = {}
    for path in (path for paths in splits.values() for path in paths):
        scanned[path] = fmt.scan(path)
        progress.update(1, path.stat().st_size)
    progress.close()
    fields = tuple(sorted({name for _, layouts, _ in scanned.values() for s in layouts for name in s.fields}))
    entries: dict[str, tuple[ShardEntry, ...]] = {}
    for split, paths in splits.items():
        split_entries = []
        for path in paths:  # indexes are written once every shard is scanned: their columns are all fields
            keys, layouts, end = scanned[path]
            checksums = shard_checksums(path, layouts, end)
            index_data = ShardIndex.build(layouts, end, fields, checksums).to_bytes()
            write_bytes_atomic(path.with_name(path.name + ".idx"), index_data)
            rel = path.relative_to(root).as_posix()
            digest = hashlib.sha256(index_data).hexdigest()
            entry = ShardEntry(rel, len(keys), path.stat().st_size, sha256_file(path), f"{rel}.idx", digest)
            split_entries.append(entry)
        entries[split] = tuple(split_entries)
    manifest = Manifest(
        format=fmt.name,
        fields=fields,
        splits=entries,
        split_rule={"method": "adopted: files directly in the folder form one split, each subfolder another"},
        source={"kind": "adopted", "path": str(root)},
    )
    write_manifest(root, manifest)
    return manifest
