"""The shard readers one process holds for a dataset, and when they open and close.

Local shards stay open (a file descriptor or an LMDB mapping each, the least recently used closed first),
and so do remote ones cached with no budget (nothing evicts them); under a ``cache_limit`` a cached remote
shard's reader lives for one read, so the node cache may evict the shard between reads.
Readers are never used across a fork: a process that inherits them drops them and opens its own.
"""

from __future__ import annotations

import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loaders.planning.planner import Run
from loaders.reading.compression import field_codecs
from loaders.reading.source import DatasetSource
from shardpipe.formats.base import Format, ShardReader
from shardpipe.formats.decompressor import FieldCodecs
from shardpipe.formats.landing import Landing
from shardpipe.formats.layout import ShardIndex, index_bytes
from shardpipe.formats.leases import BufferPool
from shardpipe.formats.readbuffer import ReadBuffer
from shardpipe.shardtable import ShardTable


def _descriptor_limit() -> int:
    """A quarter of this process's file-descriptor limit (the rest for everything else it opens), at least
    64 and at most 1024."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1024 if soft == resource.RLIM_INFINITY else max(64, min(1024, soft // 4))


MAX_OPEN_SHARDS = _descriptor_limit()
"""The most shard readers one process keeps open for a dataset (each holds a file descriptor or a mapping,
and its index): random gets touch every shard of a split, and a shard closed between two of them is
opened, and its index read and checked, again."""
INDEX_BYTES = 256 << 20
"""About the most bytes of shard indexes one process keeps for a dataset: fewer readers stay open where
their indexes are larger (never fewer than 64)."""


def open_limit(largest_index: int) -> int:
    """How many shards one process keeps open when the largest index takes ``largest_index`` bytes (0: the
    format reads by none): ``MAX_OPEN_SHARDS``, fewer where that many indexes would pass ``INDEX_BYTES``,
    at least 64."""
    if not largest_index:
        return MAX_OPEN_SHARDS
    return max(min(64, MAX_OPEN_SHARDS), min(MAX_OPEN_SHARDS, INDEX_BYTES // largest_index))


class ShardReaders:
    """This process's shard readers; dropped, never used, after a fork.

    Local shards stay open (least recently used closed first): a reader opens its file or LMDB
    environment once and reads many small spans; so do uncached remote ones, read by byte ranges, and
    cached ones when the cache has no budget. Under a budget a cached remote shard's reader lives for one
    read, so the cache may evict the shard between reads; its index is kept. Every index is checked
    against the manifest's sha256 when loaded.
    """

    def __init__(
        self,
        source: DatasetSource,
        shards: ShardTable,
        fmt: Format,
        *,
        check: bool,
        sparse: bool = False,
    ) -> None:
        """``sparse``: a remote shard is read by byte ranges unless the node cache keeps a copy of it
        already (random access: a few samples of a shard cost a request, not a download); LMDB, which
        needs a local file, still comes through the cache."""
        # What opening a reader needs, not the dataset itself: no cycle keeps files open past a drop.
        self._source, self._shards, self._format, self._check = source, shards, fmt, check
        self._sparse = sparse and fmt.needs_index
        self._pid = os.getpid()
        self._open: OrderedDict[int, ShardReader] = OrderedDict()
        self._indexes: OrderedDict[int, ShardIndex | None] = OrderedDict()
        manifest, largest = source.manifest, int(shards.num_samples.max(initial=0))
        self.limit = open_limit(
            index_bytes(largest, len(manifest.fields), manifest.index_version) if fmt.needs_index else 0
        )
        """Shard readers kept open (and indexes kept) at most: no call reads more shards than this."""
        self._thread = threading.local()  # random access reads a batch's remote shards in threads
        self._codecs: FieldCodecs | None = None
        self._codecs_loaded = False

    @property
    def codecs(self) -> FieldCodecs | None:
        """The decoders of the dataset's compressed fields, loaded on first use in this process."""
        if not self._codecs_loaded:
            self._codecs = field_codecs(self._source)
            self._codecs_loaded = True
        return self._codecs

    @contextmanager
    def reading(self, shard_index: int) -> Iterator[ShardReader]:
        self._drop_inherited()
        if self._per_read:
            index = self._index(shard_index)
            with (
                self._source.shard(self._shards[shard_index]) as path,
                self._format.open_reader(path, index, check=self._check) as reader,
            ):
                yield reader
            return
        yield self._kept(shard_index)

    def locate(
        self, runs: Sequence[Run], names: Sequence[str], *, any_size: bool = False, scattered: bool = False
    ) -> Landing | None:
        """Where the samples of ``runs`` lie, all their shards together, to be landed in the order they are
        handed out (``Format.locate``); valid until the next call in this thread (small samples are read
        into one buffer it reuses). ``None`` where that cannot be done (readers that live for one read,
        more shards than stay open, shards the format cannot take together): read shard by shard then."""
        self._drop_inherited()
        shards = dict.fromkeys(run.shard_index for run in runs)
        if self._per_read or len(shards) > self.limit or not runs:
            return None
        readers = {shard: self._kept(shard) for shard in shards}
        parts = [(readers[run.shard_index], run.start, run.stop) for run in runs]
        return self._format.locate(parts, names, self._window_buffer, any_size=any_size, scattered=scattered)

    def read_samples(
        self, picks: Sequence[tuple[int, int]], names: Sequence[str]
    ) -> list[dict[str, Any]] | None:
        """Each ``(shard, sample)`` of ``picks`` read on its own (``Format.read_samples``: random gets);
        ``None`` where that cannot be done (a remote dataset, compressed fields, more shards than stay
        open, a format that cannot): read them as a window then."""
        self._drop_inherited()
        if self._source.remote or self.codecs is not None:
            return None
        shards = {shard for shard, _ in picks}
        if len(shards) > self.limit:
            return None
        readers, kept = {}, self._open
        for shard in shards:
            if (reader := kept.get(shard)) is None:
                reader = self._kept(shard)
            else:
                kept.move_to_end(shard)  # as _kept() does, for a local reader: without its other work
            readers[shard] = reader
        return self._format.read_samples(readers, picks, names)

    def open(self, shard_index: int) -> None:
        """Open the shard's reader now, if it stays open (so threads may then share the table)."""
        self._drop_inherited()
        if not self._per_read:
            self._kept(shard_index)

    def index(self, shard_index: int) -> ShardIndex | None:
        """The shard's index, loaded once and checked against the manifest."""
        self._drop_inherited()
        return self._index(shard_index)

    def load_indexes(self, shard_indices: Sequence[int], threads: int) -> None:
        """Load the indexes of these shards not loaded yet, ``threads`` at a time: a remote one costs a
        round trip, and opening a batch's shards one after another would wait for each in turn."""
        self._drop_inherited()
        missing = [i for i in dict.fromkeys(shard_indices) if i not in self._indexes][: self.limit]
        if len(missing) < 2:
            return
        with ThreadPoolExecutor(min(threads, len(missing))) as pool:  # the source and its cache are
            found = list(pool.map(self._load_index, missing))  # thread-safe; this object is not
        for shard_index, index in zip(missing, found, strict=True):
            self._remember_index(shard_index, index)

    @property
    def _window_buffer(self) -> ReadBuffer:
        """The buffer windows are read into, one per thread, reused between reads."""
        buffer: ReadBuffer | None = getattr(self._thread, "buffer", None)
        if buffer is None:
            buffer = self._thread.buffer = ReadBuffer()
        return buffer

    @property
    def landing_pool(self) -> BufferPool:
        """The buffers landed samples are copied into (:meth:`locate`), one pool per thread."""
        pool: BufferPool | None = getattr(self._thread, "pool", None)
        if pool is None:
            pool = self._thread.pool = BufferPool()
        return pool

    @property
    def _per_read(self) -> bool:
        """Whether a reader lives for one read (a cached remote shard under a budget)."""
        return (
            self._source.remote and self._source.cached and not self._source.keeps_copies and not self._sparse
        )

    def _drop_inherited(self) -> None:
        if self._pid != os.getpid():  # inherited through a fork: never used here, never closed here
            self._open, self._indexes = OrderedDict(), OrderedDict()
            self._pid = os.getpid()

    def _kept(self, shard_index: int) -> ShardReader:
        reader, entry = self._open.get(shard_index), self._shards[shard_index]
        if reader is not None:
            self._open.move_to_end(shard_index)
            if self._source.remote:
                self._source.note_read(entry)
            return reader
        index = self._index(shard_index)
        ranged = self._sparse and not (self._source.keeps_copies and self._source.holds(entry))
        if self._source.remote and self._source.cached and not ranged:  # a copy that stays: keep it open
            with self._source.shard(entry) as path:
                reader = self._format.open_reader(path, index, check=self._check)
        elif self._source.remote:  # uncached or sparse: byte ranges of the object
            remote = self._source.ranges(entry)
            reader = self._format.open_reader(Path(entry.path), index, check=self._check, remote=remote)
        else:
            reader = self._format.open_reader(self._source.root / entry.path, index, check=self._check)
        self._open[shard_index] = reader
        while len(self._open) > self.limit:
            self._open.popitem(last=False)[1].close()
        return reader

    def _index(self, shard_index: int) -> ShardIndex | None:
        if shard_index in self._indexes:
            self._indexes.move_to_end(shard_index)
            return self._indexes[shard_index]
        index = self._load_index(shard_index)
        self._remember_index(shard_index, index)
        return index

    def _load_index(self, shard_index: int) -> ShardIndex | None:
        return self._source.index(self._shards[shard_index], check=self._check)

    def _remember_index(self, shard_index: int, index: ShardIndex | None) -> None:
        self._indexes[shard_index] = index
        while len(self._indexes) > self.limit:
            self._indexes.popitem(last=False)

    def close(self) -> None:
        if self._pid == os.getpid():
            for reader in self._open.values():
                reader.close()
        self._open.clear()
        self._indexes.clear()
