"""``shardpipe index``: adopt shards written by other tools, without repacking.

Scans webdataset tars or TFRecord files of ``tf.train.Example``, writes each one's index (spans and sample
checksums, computed now from the bytes as they are) beside it and a manifest for the folder, so the
loaders read and check them like shards shardpipe packed. Files directly in the folder form one split
(``train`` unless named); each subfolder holding shards is a split of its own.

The folder may be a URL (``s3://bucket/foreign``): each shard is then fetched once into a temporary
file, scanned and checksummed there and deleted, and the indexes and the manifest are uploaded (checked
against their sha256), the manifest last. A local folder is read in place.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from shardpipe.errors import DataError, UsageError
from shardpipe.formats import FORMAT_INFO, Format, get_format
from shardpipe.formats.layout import SampleLayout, ShardIndex, keys_checksum, shard_checksums
from shardpipe.manifest import MANIFEST_NAME, Manifest, write_manifest
from shardpipe.progress import Progress
from shardpipe.shardtable import ShardEntry, ShardTable
from shardpipe.storage import Store, local_copy, open_writable_store
from shardpipe.storage.files import sha256_file

SUFFIXES = {
    suffix: info.name for info in FORMAT_INFO.values() if info.needs_index for suffix in info.suffixes
}
"""The shards ``index`` adopts, by suffix: formats read by byte offset, whose index it can build."""


def find_shards(store: Store, top_split: str) -> dict[str, list[str]]:
    """Shard keys by split: directly under the root (``top_split``) first, then each subfolder's."""
    keys = [key for key in store.list_keys() if os.path.splitext(key)[1] in SUFFIXES]
    top = [key for key in keys if "/" not in key]
    splits: dict[str, list[str]] = {top_split: top} if top else {}
    for key in keys:
        if key.count("/") == 1:
            splits.setdefault(key.split("/")[0], []).append(key)
    return splits


def index(
    root: str | os.PathLike[str],
    *,
    split_name: str = "train",
    overwrite: bool = False,
    quiet: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> Manifest:
    """Index the shards in ``root`` (a folder or a URL) and write its manifest, last; the manifest."""
    store = _open(root, storage_options)
    if store.exists(MANIFEST_NAME) and not overwrite:
        raise UsageError(f"{store.display} already has a {MANIFEST_NAME}; pass --overwrite to index it again")
    splits = find_shards(store, split_name)
    if not splits:
        raise DataError(f"no shards (*{', *'.join(SUFFIXES)}) in {store.display} or its subfolders")
    fmt = get_format(_one_format(splits, store.display))
    scanned = _scan_shards(store, fmt, splits, quiet)
    fields = tuple(
        sorted({name for *_, layouts, _, _, _ in scanned.values() for s in layouts for name in s.fields})
    )
    entries = {split: _write_indexes(store, keys, scanned, fields) for split, keys in splits.items()}
    manifest = Manifest(
        format=fmt.name,
        fields=fields,
        splits=entries,
        split_rule={"method": "adopted: files directly in the folder form one split, each subfolder another"},
        source={"kind": "adopted", "path": store.display},
    )
    write_manifest(store, manifest)  # last: the dataset is complete once it exists
    return manifest


_ScannedShard = tuple[int, int, str, list[SampleLayout], int, np.ndarray, str]
"""One shard as scanned: samples, size, sha256, sample layouts, end of the last sample, sample checksums
and the keys' checksum."""


def _one_format(splits: dict[str, list[str]], display: str) -> str:
    """The name of the one format of every shard found (by suffix): a manifest names a single format."""
    formats = {SUFFIXES[os.path.splitext(key)[1]] for keys in splits.values() for key in keys}
    if len(formats) > 1:
        raise DataError(
            f"{display} mixes shard formats ({', '.join(sorted(formats))}); index one format per folder"
        )
    return formats.pop()


def _scan_shards(
    store: Store, fmt: Format, splits: dict[str, list[str]], quiet: bool
) -> dict[str, _ScannedShard]:
    """Every shard scanned, by key, in split order: a remote one fetched once into a temporary file,
    everything its index and manifest entry need computed from it there."""
    progress = Progress("index", sum(len(k) for k in splits.values()), unit="shards", quiet=quiet)
    scanned: dict[str, _ScannedShard] = {}
    for key in (key for keys in splits.values() for key in keys):
        with local_copy(store, key) as path:
            keys, layouts, end = fmt.scan(path)
            size = path.stat().st_size
            scanned[key] = (
                len(keys),
                size,
                sha256_file(path),
                layouts,
                end,
                shard_checksums(path, layouts, end),
                keys_checksum(keys),
            )
        progress.update(1, size)
    progress.close()
    return scanned


def _write_indexes(
    store: Store, keys: list[str], scanned: dict[str, _ScannedShard], fields: tuple[str, ...]
) -> ShardTable:
    """Write one split's indexes beside its shards; the split's manifest entries. Indexes are written
    once every shard is scanned: their columns are all fields."""
    split_entries = []
    for key in keys:
        num_samples, size, sha256, layouts, end, checksums, of_keys = scanned[key]
        index_data = ShardIndex.build(layouts, end, fields, checksums).to_bytes()
        store.put(f"{key}.idx", index_data)
        digest = hashlib.sha256(index_data).hexdigest()
        entry = ShardEntry(key, num_samples, size, sha256, f"{key}.idx", digest, of_keys)
        split_entries.append(entry)
    return ShardTable.of(split_entries)


def _open(root: str | os.PathLike[str], storage_options: Mapping[str, Any] | None) -> Store:
    store = open_writable_store(root, storage_options=storage_options, action="index")
    local = store.local_path()
    if local is not None and not local.is_dir():
        raise UsageError(f"{local} is not a directory")
    return store
