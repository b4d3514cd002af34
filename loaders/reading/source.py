"""Where a dataset's files come from: a local folder, or a URL read through the verified shard cache.

A local dataset opens its files in place (the fast path: no copy, no cache). A dataset at a URL
(``s3://``, ``gs://``, ``http(s)://``: anything ``shardpipe.storage`` takes) reads its manifest and
indexes through the storage seam, each checked against the manifest, and its shards through a per-node
``ShardCache``: downloaded once per node, checked against their sha256, held against eviction while read.
Nothing here holds a connection or a thread across a fork: the store and the cache rebuild theirs in each
process.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loaders.cache import DEFAULT_PREFETCH, ShardCache, ShardRef
from shardpipe.formats.compression import MAX_DICTIONARY_BYTES
from shardpipe.formats.layout import ShardIndex, index_bytes
from shardpipe.manifest import Manifest, dataset_location, read_manifest
from shardpipe.shardtable import ShardEntry
from shardpipe.storage import Store
from shardpipe.storage.files import read_regular


@dataclass(frozen=True, slots=True)
class RemoteOptions:
    """How a dataset at a URL is read: credentials, and the per-node cache of its shards (a local dataset
    ignores them)."""

    storage_options: Mapping[str, Any] | None = None
    """Passed to fsspec (credentials otherwise come as the cloud SDKs take them)."""
    cache: bool = True
    """``False`` reads a remote tar or TFRecord shard by byte ranges instead of through the cache
    (neighbouring ranges coalesced, the same checks): for very large shards read sparsely."""
    cache_dir: str | Path | None = None
    """The node's cache folder; default ``$SHARDPIPE_CACHE``, else the user's cache folder."""
    cache_limit: int | str | None = None
    """A byte budget such as ``"50GB"``; none by default."""
    prefetch: int = DEFAULT_PREFETCH
    """Shards each reader fetches ahead of the one it reads."""


class DatasetSource:
    """A dataset's manifest, indexes and shard files, wherever they live."""

    def __init__(self, path: str | os.PathLike[str], remote: RemoteOptions | None = None) -> None:
        remote = remote or RemoteOptions()
        store, key = dataset_location(path, remote.storage_options)
        self.manifest: Manifest = read_manifest(store, key)
        self.display = store.display
        local = store.local_path()
        self.remote = local is None
        self.root = local if local is not None else Path()  # remote files come through the store and cache
        self._store: Store | None = store if self.remote else None
        self._cache: ShardCache | None = None
        if self.remote and remote.cache:
            self._cache = ShardCache(
                store.root,
                cache_dir=remote.cache_dir,
                cache_limit=remote.cache_limit,
                prefetch=remote.prefetch,
                storage_options=remote.storage_options,
            )
        self.cached = self._cache is not None or not self.remote

    def index(self, entry: ShardEntry, *, check: bool) -> ShardIndex | None:
        """The shard's index, checked against the manifest's sha256 (unless ``check`` is off)."""
        if entry.index_path is None:
            return None
        fields, version = self.manifest.fields, self.manifest.index_version
        sha256 = entry.index_sha256 if check else None
        if self._store is None:
            path = self.root / entry.index_path
            return ShardIndex.read(path, entry.num_samples, fields, version=version, sha256=sha256)
        if self._cache is not None and (ref := self._index_ref(entry)) is not None:
            # Indexes go through the node cache too: fetched once per node, not once per worker and epoch.
            with self._cache.local(ref.path, ref.sha256, ref.num_bytes) as path:
                return ShardIndex.read(path, entry.num_samples, fields, version=version, sha256=sha256)
        size = index_bytes(entry.num_samples, len(fields), version)
        data = self._store.read_range(entry.index_path, 0, size + 1)  # a longer object fails the size check
        name = f"{self.display}/{entry.index_path}"
        return ShardIndex.from_bytes(
            data, entry.num_samples, fields, version=version, sha256=sha256, name=name
        )

    def read_file(self, relpath: str, limit: int = MAX_DICTIONARY_BYTES) -> bytes:
        """A small file of the dataset (a compression dictionary), local or remote, read whole but never
        past ``limit`` bytes, and locally only from a regular file (``OSError`` otherwise)."""
        if self._store is None:
            return read_regular(self.root / relpath, limit)
        data = self._store.read_range(relpath, 0, limit + 1)
        if len(data) > limit:
            raise OSError(errno.EFBIG, f"more than the {limit:,} bytes it may hold", relpath)
        return data

    @contextmanager
    def shard(self, entry: ShardEntry) -> Iterator[Path]:
        """A local file holding the shard's bytes while the block runs (a remote one is a verified copy)."""
        if self._cache is None:
            yield self.root / entry.path
            return
        with self._cache.local(entry.path, entry.sha256, entry.num_bytes) as path:
            yield path

    @property
    def keeps_copies(self) -> bool:
        """Whether a shard, once in the cache, stays there (a remote dataset cached with no budget): its
        reader may then stay open, as a local shard's does."""
        return self._cache is not None and self._cache.cache_limit is None

    def holds(self, entry: ShardEntry) -> bool:
        """Whether the node cache holds a verified copy of the shard now."""
        return self._cache is not None and self._cache.holds(entry.sha256)

    def note_read(self, entry: ShardEntry) -> None:
        """A kept shard is read again: the cache moves along this process's plan and prefetches."""
        if self._cache is not None:
            self._cache.note_read(entry.path, entry.sha256, entry.num_bytes)

    def ranges(self, entry: ShardEntry) -> RemoteShard:
        """The shard read by byte ranges, without a local copy (``cache=False``, or random access)."""
        if self._store is None:
            raise ValueError(f"{self.display} is a local dataset: it reads its files, not byte ranges")
        return RemoteShard(self._store, entry.path, f"{self.display}/{entry.path}", entry.num_bytes)

    def plan(self, entries: Sequence[ShardEntry]) -> None:
        """The shards this process reads next, in order: the cache prefetches and evicts by it (each
        shard's index just before the shard: a reader loads it first)."""
        if self._cache is not None:
            self._cache.plan([ref for entry in entries for ref in (self._index_ref(entry), entry) if ref])

    def _index_ref(self, entry: ShardEntry) -> ShardRef | None:
        """The shard's index as the cache fetches it, if the manifest names it with its checksum."""
        if entry.index_path is None or entry.index_sha256 is None:
            return None
        size = index_bytes(entry.num_samples, len(self.manifest.fields), self.manifest.index_version)
        return ShardRef(entry.index_path, entry.index_sha256, size)

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()


@dataclass(frozen=True, slots=True)
class RemoteShard:
    """``shardpipe.formats.RemoteBytes`` over one object of a store."""

    store: Store
    key: str
    name: str
    size: int

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return self.store.read_ranges(self.key, ranges)
