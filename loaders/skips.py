"""Samples skipped as unreadable (``on_error="skip"``), counted by every process that reads.

The counts live in a shared-memory tensor made with the dataset, one slot per DataLoader worker, so that
workers add to them and the main process sums them, under fork and spawn, with no named OS resource.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

SLOTS = 256
"""Workers counted apart (more share slots: the total stays exact)."""


class SkipCounts:
    def __init__(self) -> None:
        self._counts = torch.zeros(SLOTS, dtype=torch.int64).share_memory_()

    def add(self, worker_index: int, count: int) -> None:
        self._counts[worker_index % SLOTS] += count

    def adder(self, worker_index: int) -> Callable[[int], None]:
        """What worker ``worker_index`` tells of ``n`` samples skipped."""
        return partial(self.add, worker_index)

    def total(self) -> int:
        return int(self._counts.sum())
