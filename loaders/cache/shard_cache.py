"""``ShardCache``: remote shards served from a verified per-node cache, with a byte budget and prefetch.

``with cache.local(path, sha256, size) as file:`` gives a local file whose bytes match the manifest's
sha256, held against eviction until the block ends. The first process on a node that needs a shard
downloads it (to a temporary, checked, renamed); every other process and thread waits for that download
instead of starting its own. ``plan(shards)`` tells the cache the order this process will read in: the
next ``prefetch`` shards not yet cached are fetched in the background while the current one is read (a
background fetch of a shard another process is fetching gives up at once instead of queueing behind it),
and eviction under
``cache_limit`` drops the shard whose next use is furthest away over every live reader's plan on the node
(``loaders.cache.plans``), so one worker does not evict the shard another reads next. A dataset on a
local path is not copied: ``local`` yields the file itself.

Invariants: nothing unverified is ever served or left under a final name; a download that keeps failing
its check raises ``CorruptShardError`` naming the URL; the cache never holds more than ``cache_limit``
bytes; a killed process leaves no lock held. Everything process-bound (thread pool, filesystem object) is
rebuilt in a new process, so a cache can be handed to DataLoader workers under fork or spawn.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from loaders.cache.directory import CacheDir, default_cache_dir, wait_for_room
from loaders.cache.plans import NodePlans
from shardpipe.errors import CorruptShardError, DataError, UsageError
from shardpipe.storage import RetryPolicy, Store, open_store, redact_url
from shardpipe.units import parse_size

log = logging.getLogger("loaders.cache.shard_cache")

DEFAULT_PREFETCH = 4
LOOKAHEAD = 4
"""Prefetch looks this many times ``prefetch`` plan entries ahead for shards not yet cached: readers of
one node read many shards in the same order, so the next entries are often cached already."""
#: Downloads of one shard that may fail their sha256 check before ``CorruptShardError``.
DOWNLOAD_ATTEMPTS = 3


class ShardLike(Protocol):
    """What the cache needs of a shard; ``shardpipe.manifest.ShardEntry`` has it."""

    @property
    def path(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def num_bytes(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ShardRef:
    path: str
    sha256: str
    num_bytes: int


class ShardCache:
    """Verified local copies of the shards under ``root_url``, one download per shard per node."""

    def __init__(
        self,
        root_url: str | os.PathLike[str],
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        prefetch: int = DEFAULT_PREFETCH,
        storage_options: Mapping[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
        wait_timeout_s: float = 600.0,
    ):
        if prefetch < 0:
            raise UsageError(f"prefetch must be >= 0 shards, got {prefetch}")
        self.root_url = root_url
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.cache_limit = parse_size(cache_limit) if cache_limit is not None else None
        self.prefetch = prefetch
        self.storage_options = dict(storage_options or {})
        self.retry = retry
        self.wait_timeout_s = wait_timeout_s
        self._reset_process_state()

    def _reset_process_state(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._dir: CacheDir | None = None
        self._plans: NodePlans | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight: dict[str, Future[None]] = {}
        self._seen_cached: set[str] = set()
        """Shards this process found in a cache without a budget, where they stay: prefetch passes over
        them without a ``stat`` each time."""
        self._plan: list[ShardRef] = []
        self._uses: dict[str, list[int]] = {}
        self._position = 0

    def __getstate__(self) -> dict[str, Any]:
        keep = (
            "root_url",
            "cache_dir",
            "cache_limit",
            "prefetch",
            "storage_options",
            "retry",
            "wait_timeout_s",
        )
        return {name: getattr(self, name) for name in keep} | {"plan": self._plan, "position": self._position}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            if name not in ("plan", "position"):
                setattr(self, name, value)
        self._reset_process_state()
        self.plan(state["plan"])
        self._set_position(state["position"])

    @property
    def store(self) -> Store:
        self._check_process()
        if self._store is None:
            self._store = open_store(self.root_url, storage_options=self.storage_options, retry=self.retry)
        return self._store

    @property
    def directory(self) -> CacheDir:
        if self._dir is None:
            self._dir = CacheDir(self.cache_dir, self.cache_limit)
        return self._dir

    @property
    def node_plans(self) -> NodePlans:
        if self._plans is None:
            self._plans = NodePlans(self.directory.root)
        return self._plans

    def usage(self) -> int:
        """Bytes the node's cache holds now (shards plus downloads in progress)."""
        return self.directory.usage()

    def holds(self, sha256: str) -> bool:
        """Whether the node's cache holds a verified copy of the shard with this sha256 now."""
        return self.directory.final(sha256).exists()

    def plan(self, shards: Sequence[ShardLike]) -> None:
        """The shards this process will read, in order; repeats allowed. Replaces any earlier plan."""
        refs = [ShardRef(s.path, s.sha256, int(s.num_bytes)) for s in shards]
        for ref in refs:
            self._check_fits(ref)
        with self._lock:
            self._plan = refs
            self._uses = {}
            for index, ref in enumerate(refs):
                self._uses.setdefault(ref.sha256, []).append(index)
            self._position = 0
        if self.cache_limit is not None and self.store.local_path() is None:
            self.node_plans.publish([ref.sha256 for ref in refs])

    @contextmanager
    def local(self, path: str, sha256: str, size: int) -> Iterator[Path]:
        """A verified local copy of shard ``path``, never evicted while the block runs."""
        self._check_process()
        local = self.store.local_path(path)
        if local is not None:
            yield local
            return
        ref = ShardRef(path, sha256, size)
        self._check_fits(ref)
        self._advance(ref)
        deadline = time.monotonic() + self.wait_timeout_s
        while True:
            self._ensure(ref, background=False, deadline=deadline)
            with self.directory.reading(sha256) as held:
                if held is not None:
                    self.directory.touch(sha256)
                    yield held
                    return
            if time.monotonic() > deadline:  # evicted between download and read, every time
                raise DataError(
                    f"shard {self._shown(path)} kept being evicted before it could be read; "
                    f"raise cache_limit ({self.cache_limit} bytes)"
                )

    def note_read(self, path: str, sha256: str, size: int) -> None:
        """Shard ``path`` is read again from a copy the caller holds open: move along the plan, prefetching
        as :meth:`local` does, without its locks and checks."""
        self._advance(ShardRef(path, sha256, size))

    def wait_prefetched(self, timeout: float | None = None) -> None:
        """Block until the prefetches started so far have finished (benchmarks and tests use it)."""
        with self._lock:
            running = list(self._in_flight.values())
        for future in running:
            future.exception(timeout=timeout)

    def close(self) -> None:
        """Stop prefetching; downloads in progress finish (their results stay cached)."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None
        if self._plans is not None and self._pid == os.getpid():
            self._plans.withdraw()

    def __enter__(self) -> ShardCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_use(self, sha256: str) -> float:
        """Shards until ``sha256`` is read again in this process's plan; infinity if never."""
        uses = self._uses.get(sha256)
        if not uses:
            return math.inf
        found = bisect.bisect_left(uses, self._position)
        return uses[found] - self._position if found < len(uses) else math.inf

    def _set_position(self, position: int) -> None:
        self._position = position
        if self._plans is not None:
            self._plans.advance(position)

    def _advance(self, ref: ShardRef) -> None:
        with self._lock:
            uses = self._uses.get(ref.sha256, [])
            found = bisect.bisect_left(uses, self._position)
            if found < len(uses) and uses[found] != self._position:
                self._set_position(uses[found])
            ahead = (
                self._plan[self._position + 1 : self._position + 1 + LOOKAHEAD * self.prefetch]
                if uses
                else []
            )
        started = 0
        for nxt in dict.fromkeys(ahead):  # distinct, in plan order
            if started == self.prefetch:
                break
            started += self._start_prefetch(nxt)

    def _start_prefetch(self, ref: ShardRef) -> bool:
        """Fetch ``ref`` in the background unless it is cached or this process already fetches it;
        whether it is (or was already) on its way."""
        if ref.sha256 in self._seen_cached:
            return False
        if self.directory.final(ref.sha256).exists():
            if self.cache_limit is None:
                self._seen_cached.add(ref.sha256)
            return False
        with self._lock:
            running = self._in_flight.get(ref.sha256)
            if running is None or running.done():
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.prefetch, thread_name_prefix="shardpipe-prefetch")
                self._in_flight[ref.sha256] = self._pool.submit(self._prefetch, ref)
        return True

    def _prefetch(self, ref: ShardRef) -> None:
        try:
            self._ensure(ref, background=True, deadline=0.0)
        except Exception as exc:  # the foreground read retries and raises with the full story
            log.debug("prefetch of %s failed: %s", self._shown(ref.path), exc)

    def _ensure(self, ref: ShardRef, *, background: bool, deadline: float) -> None:
        """Make ``ref`` present in the cache; a background prefetch gives up rather than wait for room."""
        cache = self.directory
        if cache.final(ref.sha256).exists():
            return
        with cache.fetching(ref.sha256, wait=not background) as mine:
            if not mine or cache.final(ref.sha256).exists():  # another process or thread has it in hand
                return
            needed_in = self.next_use(ref.sha256) if background else 0.0

            def reserve() -> Path | None:
                plans = self.node_plans
                return cache.reserve(ref.sha256, ref.num_bytes, plans.next_uses, needed_in=needed_in)

            if background:
                temp = reserve()
                if temp is None:
                    return
            else:
                temp = wait_for_room(reserve, deadline, lambda: self._no_room(ref))
            try:
                self._download(ref, temp)
                cache.publish(temp, ref.sha256)
            finally:
                temp.unlink(missing_ok=True)

    def _download(self, ref: ShardRef, temp: Path) -> None:
        found = ""
        for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
            digest = hashlib.sha256()
            written = 0
            with open(temp, "r+b") as out:
                for chunk in self.store.iter_chunks(ref.path, ref.num_bytes):
                    digest.update(chunk)
                    out.write(chunk)
                    written += len(chunk)
            found = digest.hexdigest()
            if written == ref.num_bytes and found == ref.sha256:
                return
            log.warning(
                "download of %s failed its check (attempt %d of %d)",
                self._shown(ref.path),
                attempt,
                DOWNLOAD_ATTEMPTS,
            )
        raise CorruptShardError.at(
            self._shown(ref.path),
            f"downloaded {DOWNLOAD_ATTEMPTS} times and the bytes never matched the manifest (sha256 {found}, "
            f"expected {ref.sha256}, {ref.num_bytes} bytes); nothing was cached. "
            "Repack or re-upload the shard",
        )

    def _check_fits(self, ref: ShardRef) -> None:
        if self.cache_limit is not None and ref.num_bytes > self.cache_limit:
            raise UsageError(
                f"cache_limit {self.cache_limit} bytes is smaller than shard {ref.path} ({ref.num_bytes} "
                "bytes); raise cache_limit to at least the largest shard, or read without a cache"
            )

    def _no_room(self, ref: ShardRef) -> str:
        return (
            f"no room in cache {self.directory.root} (cache_limit {self.cache_limit} bytes, "
            f"{self.directory.usage()} held) for shard {self._shown(ref.path)} ({ref.num_bytes} bytes) "
            f"after {self.wait_timeout_s} s: the shards held are all being read or downloaded on this "
            "node; raise cache_limit or lower workers x prefetch"
        )

    def _shown(self, path: str) -> str:
        return redact_url(self.store.url(path))

    def _check_process(self) -> None:
        if self._pid != os.getpid():  # a forked child: the parent's pool and connections are not ours
            if self._plans is not None:
                self._plans.forget_inherited()
            plan, position = self._plan, self._position
            self._reset_process_state()
            self.plan(plan)
            self._set_position(position)
