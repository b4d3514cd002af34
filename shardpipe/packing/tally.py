"""What the shard writers of a local pack have written so far, summed over its processes: what moves the
progress bar inside a shard, where a shard's own result comes only when it is finished.

Two counters (samples, bytes) in anonymous shared memory, made by the driver for its local pool and
handed to each worker when it starts (no named resource a crash could leave); a writer adds each batch.
The driver reads them while it waits for shards. Workers of another engine (Ray) have none: there a
shard counts when it finishes.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.sharedctypes import RawArray
from typing import Any


class Tally:
    """Samples and bytes written, shared by the driver and its local pool's workers."""

    def __init__(self) -> None:
        self._values: Any = RawArray("q", 2)
        self._lock = multiprocessing.Lock()
        self.listener: Callable[[], None] | None = None
        """Called after each add in the process that set it (the driver, writing shards itself)."""

    def __getstate__(self) -> dict[str, Any]:  # passed to a worker at its start; the listener stays here
        return {"_values": self._values, "_lock": self._lock, "listener": None}

    def add(self, samples: int, num_bytes: int) -> None:
        with self._lock:
            self._values[0] += samples
            self._values[1] += num_bytes
        if self.listener is not None:
            self.listener()

    def read(self) -> tuple[int, int]:
        with self._lock:
            return int(self._values[0]), int(self._values[1])


_current: Tally | None = None


def install(tally: Tally | None) -> None:
    """Make ``tally`` the one this process's shard writers add to (a pool worker's initializer calls it)."""
    global _current
    _current = tally


def current() -> Tally | None:
    return _current


def count(samples: int, num_bytes: int) -> None:
    """A shard writer wrote ``samples`` more, of ``num_bytes`` (a no-op where no tally is installed)."""
    if _current is not None:
        _current.add(samples, num_bytes)
