"""``shardpipe verify``: recompute everything the manifest claims and list every disagreement.

Per shard: size, sha256, every record parsed (and, for LMDB, each record's checksum checked), the sample
count, and, for formats with an index, the index's sha256 and every entry recomputed from the shard,
sample checksums included. The checksums cover compressed fields as stored (the frames); each frame is
then decompressed as a reader would, so one that does not decode is named too, and the dictionaries are
checked against the manifest's sha256. A file is read only if it is a regular file, and a dictionary no
further than a dictionary may hold.

A dataset at a URL is checked the same way, on a local copy of each shard and its index (fetched one
shard at a time, deleted after); problems name the object's URL.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from shardpipe.errors import DataError
from shardpipe.formats import Format, get_format
from shardpipe.formats.compression import MAX_DICTIONARY_BYTES
from shardpipe.formats.decompressor import FieldCodecs
from shardpipe.formats.layout import CHECKSUM, SampleLayout, ShardIndex, keys_checksum, shard_checksums
from shardpipe.manifest import Manifest, dataset_location, read_manifest
from shardpipe.progress import Progress
from shardpipe.shardtable import ShardEntry
from shardpipe.storage import Store, local_copy, redact_url
from shardpipe.storage.files import sha256_file

FRAME_CHECK_SAMPLES = 1024
"""Samples whose frames are decompressed together (bounds the memory of a check)."""


def verify(
    root: str | os.PathLike[str], *, quiet: bool = False, storage_options: Mapping[str, Any] | None = None
) -> list[str]:
    """Return one line per problem (file and position); an empty list means the dataset is sound.

    ``root`` is a dataset folder or manifest, a path or a URL. Raises :class:`DataError` when the
    manifest itself cannot be read.
    """
    store, key = dataset_location(root, storage_options)
    manifest = read_manifest(store, key)
    fmt = get_format(manifest.format)
    shards = [s for split in manifest.splits.values() for s in split]
    progress = Progress("verify", sum(s.num_samples for s in shards), quiet=quiet)
    problems = _verify_dictionaries(store, manifest)
    codecs = None
    if manifest.compression and not problems:  # frames are decompressed where their dictionaries are sound
        read = partial(_read_bounded, store, limit=MAX_DICTIONARY_BYTES)
        try:
            codecs = FieldCodecs.load(manifest.compression, read, redact_url(store.url()))
        except DataError as exc:
            problems.append(str(exc))
    for entry in shards:
        try:
            problems += _verify_shard(store, entry, fmt, manifest, codecs)
        except OSError as exc:
            problems.append(f"{entry.path}: cannot read: {exc}")
        progress.update(entry.num_samples, entry.num_bytes)
    progress.close()
    return problems


def _verify_dictionaries(store: Store, manifest: Manifest) -> list[str]:
    """The problems of the compression dictionaries the manifest names (missing, or another sha256)."""
    problems = []
    for name, codec in manifest.compression.items():
        if codec.dictionary is None:
            continue
        if not store.exists(codec.dictionary):
            problems.append(f"{codec.dictionary}: missing (the dictionary of field {name!r})")
            continue
        try:
            size = store.size(codec.dictionary)
            if size > MAX_DICTIONARY_BYTES:
                problems.append(f"{codec.dictionary}: {size:,} bytes, more than a dictionary may hold")
            elif store.sha256(codec.dictionary)[0] != codec.dictionary_sha256:
                problems.append(f"{codec.dictionary}: sha256 differs from the manifest (field {name!r})")
        except OSError as exc:
            problems.append(f"{codec.dictionary}: cannot read: {exc}")
    return problems


def _read_bounded(store: Store, key: str, limit: int) -> bytes:
    if (size := store.size(key)) > limit:
        raise OSError(f"{size:,} bytes, more than the {limit:,} it may hold")
    return store.read(key)


def _verify_shard(
    store: Store, entry: ShardEntry, fmt: Format, manifest: Manifest, codecs: FieldCodecs | None
) -> list[str]:
    """The problems of one shard, checked on a local copy whose path messages show as the shard's URL."""
    if not store.exists(entry.path):
        return [f"{entry.path}: missing"]
    with ExitStack() as stack:
        path = stack.enter_context(local_copy(store, entry.path))
        index = None
        if entry.index_path is not None and store.exists(entry.index_path):
            index = stack.enter_context(local_copy(store, entry.index_path))
        problems = _check_shard(path, index, entry, fmt, manifest, codecs)
    shown = redact_url(store.url(entry.path))
    return [line.replace(str(path), shown) for line in problems]


def _check_shard(
    path: Path,
    index: Path | None,
    entry: ShardEntry,
    fmt: Format,
    manifest: Manifest,
    codecs: FieldCodecs | None,
) -> list[str]:
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
    elif entry.keys_checksum is not None and keys_checksum(keys) != entry.keys_checksum:
        problems.append(f"{entry.path}: its keys differ from the manifest's checksum of them")
    extra = {name for sample in layouts for name in sample.fields} - set(manifest.fields)
    if extra:
        problems.append(f"{entry.path}: fields {sorted(extra)} are not in the manifest")
    elif entry.index_path is not None:
        problems += _verify_index(index, entry, path, layouts, end, manifest)
    if codecs is not None and not problems:
        problems += _verify_frames(path, [layout.offset for layout in layouts] + [end], entry, fmt, codecs)
    return problems


def _verify_frames(
    path: Path, offsets: list[int], entry: ShardEntry, fmt: Format, codecs: FieldCodecs
) -> list[str]:
    """Decompress every stored frame of the compressed fields, as a reader does: a frame that does not
    decode, or claims more than the pack's ``max_bytes``, is named with its sample."""
    with fmt.open_reader(path, offsets if fmt.needs_index else None, check=False) as reader:
        for start in range(0, entry.num_samples, FRAME_CHECK_SAMPLES):
            stop = min(start + FRAME_CHECK_SAMPLES, entry.num_samples)
            keys, fields = reader.read_runs([(start, stop)], codecs.names)
            try:
                codecs.decode_columns(keys, fields, entry.path, range(start, stop))
            except DataError as exc:
                return [str(exc)]
    return []


def _verify_index(
    index: Path | None,
    entry: ShardEntry,
    path: Path,
    layouts: list[SampleLayout],
    end: int,
    manifest: Manifest,
) -> list[str]:
    if index is None:
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
