"""Every reader's plan on a node, shared through the cache folder, so eviction weighs all of them.

Each ``ShardCache`` that has a plan publishes it as ``plans/<id>.json`` (the sha256s in reading order) with
its position in ``plans/<id>.pos``, and holds a shared ``flock`` on ``plans/<id>.lock`` for as long as it
lives. An evicting process reads the live plans and ranks each cached shard by its nearest next use over
all of them, so one worker does not evict the shard another worker is about to read. A plan whose lock can
be taken exclusively belongs to a dead process and is removed.

Distances are counted in each reader's own shards; readers on one node advance at similar rates, so the
nearest next use over all plans is a fair stand-in for the node's next use.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import math
import os
from contextlib import suppress
from pathlib import Path

_POSITION_WIDTH = 20
_ids = itertools.count()


class NodePlans:
    """This process's published plan (if any) and a view of every live one in ``root/plans``."""

    def __init__(self, root: Path):
        self.dir = root / "plans"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._id: str | None = None
        self._lock_fd: int | None = None

    def publish(self, plan: list[str]) -> None:
        """Replace this process's plan; its position starts at 0."""
        self.withdraw()
        self._id = f"{os.getpid()}-{next(_ids)}"
        temp = self.dir / f"{self._id}.json.tmp"
        temp.write_text(json.dumps(plan))
        os.replace(temp, self.dir / f"{self._id}.json")
        self.advance(0)
        # Locked before it gets its final name, so no evictor can see it unlocked and take it for dead.
        self._lock_fd = os.open(self.dir / f"{self._id}.lock.tmp", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_SH)
        os.replace(self.dir / f"{self._id}.lock.tmp", self.dir / f"{self._id}.lock")

    def advance(self, position: int) -> None:
        if self._id is not None:
            (self.dir / f"{self._id}.pos").write_text(str(position).rjust(_POSITION_WIDTH))

    def withdraw(self) -> None:
        """Remove this process's plan (also done for it by others once it has died)."""
        if self._id is not None:
            _remove(self.dir, self._id)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        self._id = self._lock_fd = None

    def forget_inherited(self) -> None:
        """In a forked child: drop the parent's plan without touching its files or its lock."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # a duplicate descriptor: the parent still holds the lock
        self._id = self._lock_fd = None

    def next_uses(self) -> dict[str, float]:
        """For each planned sha256: shards until some live reader on the node reads it next."""
        nearest: dict[str, float] = {}
        for lock in self.dir.glob("*.lock"):
            plan_id = lock.name.removesuffix(".lock")
            if not _alive(lock):
                _remove(self.dir, plan_id)
                continue
            try:
                plan = json.loads((self.dir / f"{plan_id}.json").read_text())
                position = int((self.dir / f"{plan_id}.pos").read_text())
            except (FileNotFoundError, ValueError):  # being published or withdrawn right now
                continue
            for index in range(len(plan) - 1, position - 1, -1):
                nearest[plan[index]] = min(nearest.get(plan[index], math.inf), index - position)
        return nearest


def _alive(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _remove(directory: Path, plan_id: str) -> None:
    for suffix in (".json", ".pos", ".lock"):
        with suppress(FileNotFoundError):
            (directory / f"{plan_id}{suffix}").unlink()
