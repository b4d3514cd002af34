"""The on-disk protocol of the per-node shard cache: layout, locks, the byte budget and eviction.

Layout under the cache root (``v1/`` so a later layout can live beside it)::

    objects/<sha256>              a verified shard, named by its content
    objects/<sha256>.tmp-<pid>-…  a download in progress, already at its full size (the reservation)
    locks/<sha256>.fetch          held exclusively while that shard is downloaded (one download per node)
    locks/<sha256>.read           held shared while a process reads the shard; eviction needs it exclusively
    budget.lock                   held exclusively while space is reserved or freed

Invariants:
- Every lock is ``fcntl.flock`` on a file: the kernel drops it when its holder dies, so no lock outlives a
  killed process; its leftover temporary is recognised (nobody holds its fetch lock) and swept.
- A forked child closes its copies of the descriptors behind the locks held at the fork (by other
  threads, which do not exist in the child): a flock belongs to the open file, so a copy no one will ever
  close would hold it for as long as the child lives, and the child would wait on itself for it.
- The sum of file sizes under ``objects/`` never exceeds the budget: space is claimed only under
  ``budget.lock``, by evicting first and then extending the temporary to the shard's full size, and a
  download is renamed into place under it too, so the count taken there never misses a shard.
- A shard being read is never evicted; a file appears under its final name only after its sha256 matched.
"""

from __future__ import annotations

import fcntl
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

import platformdirs

from shardpipe.errors import DataError
from shardpipe.storage.files import fsync_file

CACHE_ENV = "SHARDPIPE_CACHE"
LAYOUT = "v1"
_TEMP = ".tmp-"
_HEX = frozenset("0123456789abcdef")
_temp_numbers = iter(range(1 << 62))
_temp_lock = threading.Lock()


class _Held:
    """The descriptor of one ``flocked`` call, registered while it is open (see ``_after_fork_in_child``)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd


_held: set[_Held] = set()


def _after_fork_in_child() -> None:
    """Close the copies of every lock descriptor open at the fork (module doc), and renew the temporary
    names' lock, which a thread of the parent may have held."""
    global _temp_lock
    for held in list(_held):
        with suppress(OSError):
            os.close(held.fd)
    _held.clear()
    _temp_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def flocked(path: Path, mode: int) -> Iterator[bool]:
    """Hold ``flock(mode)`` on ``path`` (created if missing); yields False if non-blocking and refused."""
    held = _Held(os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
    _held.add(held)
    try:
        try:
            fcntl.flock(held.fd, mode)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        if held in _held:  # not closed by a fork since: closing the descriptor releases the lock
            _held.discard(held)
            os.close(held.fd)


class CacheDir:
    """One cache folder shared by every process on the node; ``limit`` None means no budget."""

    def __init__(self, root: Path, limit: int | None):
        self.root = Path(root) / LAYOUT
        self.limit = limit
        self.objects = self.root / "objects"
        self.locks = self.root / "locks"
        self.objects.mkdir(parents=True, exist_ok=True)
        self.locks.mkdir(parents=True, exist_ok=True)

    def final(self, sha256: str) -> Path:
        return self.objects / sha256

    def usage(self) -> int:
        """Bytes held: verified shards plus the full size of every download in progress."""
        total = 0
        for entry in os.scandir(self.objects):
            with suppress(FileNotFoundError):  # evicted or renamed meanwhile
                total += entry.stat().st_size
        return total

    @contextmanager
    def fetching(self, sha256: str, *, wait: bool = True) -> Iterator[bool]:
        """Exclusive right to download ``sha256`` on this node; yields False when ``wait`` is False and
        another process or thread holds it."""
        with flocked(self.locks / f"{sha256}.fetch", fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB)) as mine:
            yield mine

    @contextmanager
    def reading(self, sha256: str) -> Iterator[Path | None]:
        """Hold ``sha256`` against eviction; yields its path, or None if it is not (or no longer) cached."""
        with flocked(self.locks / f"{sha256}.read", fcntl.LOCK_SH):
            final = self.final(sha256)
            yield final if final.exists() else None

    def reserve(
        self, sha256: str, size: int, next_uses: Callable[[], Mapping[str, float]], *, needed_in: float
    ) -> Path | None:
        """A temporary of ``size`` bytes for ``sha256``, evicting shards used later than ``needed_in``.

        ``next_uses()`` (asked only if something must go) gives each shard's distance to its next use;
        shards it does not name are never used again. Returns None when the budget cannot make room now
        (every other shard is being read, reserved, or needed sooner); the caller waits or gives up. The
        caller holds ``fetching(sha256)``.
        """
        with flocked(self.root / "budget.lock", fcntl.LOCK_EX):
            self._sweep_abandoned(held=sha256)
            if self.limit is not None:
                excess = self.usage() + size - self.limit
                if excess > 0 and not self._evict(excess, next_uses(), needed_in):
                    return None
            with _temp_lock:
                number = next(_temp_numbers)
            temp = self.objects / f"{sha256}{_TEMP}{os.getpid()}-{number}"
            with open(temp, "wb") as f:
                f.truncate(size)  # the reservation: counted in usage() from now on
            return temp

    def publish(self, temp: Path, sha256: str) -> Path:
        """Rename a checked download into place, under ``budget.lock``: a count of the space taken that
        listed the temporary and looked at it after the rename would miss the shard, and let the budget
        be overrun by it."""
        fsync_file(temp)
        final = self.final(sha256)
        with flocked(self.root / "budget.lock", fcntl.LOCK_EX):
            os.replace(temp, final)
        fsync_file(self.objects)
        return final

    def touch(self, sha256: str) -> None:
        """Mark a use, so ties among shards with no planned use go to the least recently used."""
        with suppress(FileNotFoundError):
            os.utime(self.final(sha256))

    def _evict(self, excess: int, next_uses: Mapping[str, float], needed_in: float) -> bool:
        candidates = []
        for entry in os.scandir(self.objects):
            if len(entry.name) == 64 and set(entry.name) <= _HEX:
                try:
                    stat = entry.stat()
                except FileNotFoundError:
                    continue
                distance = next_uses.get(entry.name, math.inf)
                candidates.append((-distance, stat.st_mtime, entry.name, stat.st_size))
        freed = 0
        for minus_next, _, name, size in sorted(candidates):  # furthest next use first, then oldest
            if -minus_next <= needed_in:
                break
            with flocked(self.locks / f"{name}.read", fcntl.LOCK_EX | fcntl.LOCK_NB) as free:
                if not free:  # somebody is reading it
                    continue
                self.final(name).unlink(missing_ok=True)
            freed += size
            if freed >= excess:
                return True
        return False

    def _sweep_abandoned(self, held: str) -> None:
        """Delete temporaries whose downloader died: nobody holds their fetch lock.

        The caller holds the fetch lock of ``held``, so any temporary of that shard is a dead one's.
        """
        for entry in os.scandir(self.objects):
            if _TEMP not in entry.name:
                continue
            sha256 = entry.name.split(_TEMP)[0]
            if sha256 == held:
                Path(entry.path).unlink(missing_ok=True)
                continue
            with flocked(self.locks / f"{sha256}.fetch", fcntl.LOCK_EX | fcntl.LOCK_NB) as abandoned:
                if abandoned:
                    Path(entry.path).unlink(missing_ok=True)


def wait_for_room(
    try_reserve: Callable[[], Path | None], deadline: float, describe: Callable[[], str]
) -> Path:
    """Retry ``try_reserve`` until it succeeds or ``deadline`` (monotonic) passes, then raise."""
    pause = 0.01
    while (temp := try_reserve()) is None:
        if time.monotonic() > deadline:
            raise DataError(describe())
        time.sleep(pause)
        pause = min(pause * 2, 0.5)
    return temp


def default_cache_dir() -> Path:
    """``$SHARDPIPE_CACHE``, else the user's cache folder (XDG rules on Linux, via platformdirs)."""
    if env := os.environ.get(CACHE_ENV):
        return Path(env)
    return Path(platformdirs.user_cache_dir("shardpipe"))
