"""A shared-memory ring per DataLoader worker: bulk bytes through shared pages, a descriptor through the pipe.

One anonymous shared uint8 tensor per ring, made in the main process before the workers fork (torch's
file-descriptor strategy unlinks it at once, so nothing named outlives a crash). A worker copies each
field into its next free slot and sends a ``RingBatch`` (slot and layout); unpickling it in the main process
copies the fields out and frees the slot. Each worker writes only its own slots and counter, the main only
the freed counter, so one writer per value and no lock; a worker waits while all its slots are unread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from loaders import RaggedBytes

RING_SLOTS = 6  # > prefetch_factor: a worker can run ahead of the main by every batch it may have queued
RINGS: dict[int, Ring] = {}  # registered in the main process before the fork; workers inherit it


@dataclass(frozen=True, slots=True)
class Ring:
    """Per worker: ``RING_SLOTS`` slots of ``slot_bytes`` in one shared tensor; [written, freed] counts."""

    memory: torch.Tensor  # (num_workers, RING_SLOTS, slot_bytes) uint8, shared
    counts: torch.Tensor  # (num_workers, 2) int64, shared

    @classmethod
    def create(cls, num_workers: int, slot_bytes: int) -> Ring:
        memory = torch.empty((num_workers, RING_SLOTS, slot_bytes), dtype=torch.uint8).share_memory_()
        return cls(memory, torch.zeros((num_workers, 2), dtype=torch.int64).share_memory_())

    def write(self, worker: int, batch: dict[str, Any]) -> tuple[int, list[tuple[str, str, Any]]]:
        """Copy the batch's bulk fields into the worker's next free slot; return (slot, layout)."""
        while int(self.counts[worker, 0]) - int(self.counts[worker, 1]) >= RING_SLOTS:
            time.sleep(0.0001)  # every slot still unread by the main process
        slot = int(self.counts[worker, 0]) % RING_SLOTS
        target = self.memory[worker, slot].numpy()
        layout: list[tuple[str, str, Any]] = []
        pos = 0
        for name, value in batch.items():
            if isinstance(value, RaggedBytes):
                pos = _put(target, pos, np.frombuffer(value.buffer, dtype=np.uint8))
                pos = _put(target, pos, value.offsets.view(np.uint8))
                layout.append((name, "ragged", (len(value.buffer), value.offsets.nbytes)))
            elif isinstance(value, torch.Tensor):
                array = value.numpy()
                pos = _put(target, pos, array.reshape(-1).view(np.uint8))
                layout.append((name, "tensor", (array.dtype.str, array.shape)))
            else:
                layout.append((name, "inline", value))  # keys: small, sent with the descriptor
        self.counts[worker, 0] += 1
        return slot, layout

    def read(self, worker: int, slot: int, layout: list[tuple[str, str, Any]]) -> dict[str, Any]:
        """Copy the fields out of the slot (so the slot can be reused at once) and free it."""
        source = self.memory[worker, slot].numpy()
        batch: dict[str, Any] = {}
        pos = 0
        for name, kind, info in layout:
            if kind == "ragged":
                size, offsets_bytes = info
                buffer = source[pos : pos + size].tobytes()
                pos += size
                offsets = source[pos : pos + offsets_bytes].view(np.int64).copy()
                pos += offsets_bytes
                batch[name] = RaggedBytes(buffer, offsets)
            elif kind == "tensor":
                dtype, shape = np.dtype(info[0]), info[1]
                size = dtype.itemsize * int(np.prod(shape))
                batch[name] = torch.from_numpy(source[pos : pos + size].view(dtype).reshape(shape).copy())
                pos += size
            else:
                batch[name] = info
        self.counts[worker, 1] += 1
        return batch


def _put(target: np.ndarray, pos: int, data: np.ndarray) -> int:
    if pos + len(data) > len(target):
        raise ValueError(f"a batch needs more than the ring's {len(target)} bytes per slot")
    target[pos : pos + len(data)] = data
    return pos + len(data)


class RingBatch:
    """What crosses the pipe on the ring path: where the batch lies, rebuilt in the main by ``_from_ring``."""

    def __init__(self, ring_id: int, worker: int, slot: int, layout: list[tuple[str, str, Any]]) -> None:
        self.args = (ring_id, worker, slot, layout)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _from_ring, self.args


def _from_ring(ring_id: int, worker: int, slot: int, layout: list[tuple[str, str, Any]]) -> dict[str, Any]:
    return RINGS[ring_id].read(worker, slot, layout)
