"""How a worker's batches reach the main process: pickled through the result pipe, or through a shared ring.

The ring is one anonymous shared-memory tensor per loader iterator, made in the main process before the
workers start (torch's file-descriptor strategy unlinks it at once, so nothing named outlives a crash):
``num_slots`` slots of ``slot_bytes`` per worker, and a ``[written, freed]`` counter pair per worker. A
worker copies a batch's bulk bytes (each ``RaggedBytes``'s buffer and offsets, each tensor) into its next
free slot and sends a small ``RingBatch`` descriptor through the pipe; unpickling the descriptor in the main
process copies the bytes out, into buffers it reuses once no batch refers to them (``BufferPool``), and
frees the slot. Invariants:

- one writer per counter, no lock: the worker only advances ``written``, the main only ``freed``; the
  slot's bytes reach the main before their descriptor (a pipe write), and the main's copy-out is done
  before its free is stored on x86-64's ordering (where this is tested; a weakly ordered CPU would want a
  fence there);
- a worker's descriptors are unpickled in the order it wrote them (one pipe, one reader), so slots are
  freed in order and ``seq % num_slots`` names the slot;
- the main copies out before freeing, so a batch a user keeps never pins a slot (views would let a user
  who keeps batches stall the workers);
- a batch larger than a slot, or one that finds every slot taken after ``FULL_WAIT_S``, goes inline, as on
  the pipe: a live main that is not reading is a paused trainer, not a failure. A worker raises
  ``RingStalledError`` naming itself when the main process is gone, or when nothing was freed over
  ``STALL_WAIT_S`` of timed-out waits (600 batches, far more than DataLoader lets a worker have unread).
"""

from __future__ import annotations

import itertools
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import get_worker_info

from loaders.transfer.chunks import Chunk
from loaders.transfer.collate import Batch, RaggedBytes
from shardpipe.errors import ShardpipeError
from shardpipe.formats.leases import POOLED_BUFFERS, POOLED_BYTES, BufferPool

Transport = Literal["auto", "pipe", "ring"]
FULL_WAIT_S = 0.1
STALL_WAIT_S = 60.0
_MIN_DELAY_S, _MAX_DELAY_S = 50e-6, 5e-3
_RINGS: weakref.WeakValueDictionary[int, Ring] = weakref.WeakValueDictionary()  # main process: by token
_tokens = itertools.count()


class RingStalledError(ShardpipeError, RuntimeError):
    """A loader worker cannot hand its batch over: the main process is gone or never frees a slot."""


def shm_free_bytes() -> int:
    """Free bytes in /dev/shm, where anonymous shared memory lives (a container may give it little)."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return stat.f_bavail * stat.f_frsize


Layout = list[tuple[str, str, Any]]  # (field, kind, info) in slot order


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Ring:
    """``num_slots`` slots of ``slot_bytes`` per worker in shared memory, and their counters."""

    memory: torch.Tensor = field(repr=False)  # (num_workers, num_slots, slot_bytes) uint8, shared
    counts: torch.Tensor = field(repr=False)  # (num_workers, 2) int64, shared: [written, freed]
    token: int  # names this ring in the main process's registry
    parent_pid: int  # the main process: a worker whose parent changed knows it is gone
    # NumPy views of the same memory: indexing them costs far less than indexing the tensors
    _slots: np.ndarray = field(init=False, repr=False, compare=False)
    _counts: np.ndarray = field(init=False, repr=False, compare=False)
    _pool: BufferPool = field(init=False, repr=False, compare=False)  # main: what batches are copied into

    def __post_init__(self) -> None:
        object.__setattr__(self, "_slots", self.memory.numpy())
        object.__setattr__(self, "_counts", self.counts.numpy())
        # The main holds a copy of every message in flight (taken as it arrives, handed out in turn): as
        # many bytes as the ring holds stay pooled (a buffer a field, a few fields a message; buffers are
        # made in powers of two, hence twice), so a deep prefetch does not copy into fresh memory.
        workers, slots, _ = self.memory.shape
        most_bytes = max(POOLED_BYTES, 2 * self.memory.numel())
        pool = BufferPool(max(POOLED_BUFFERS, 4 * workers * slots), most_bytes)
        object.__setattr__(self, "_pool", pool)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # the tensors travel, never the views
        return Ring, (self.memory, self.counts, self.token, self.parent_pid)

    @classmethod
    def create(cls, num_workers: int, num_slots: int, slot_bytes: int) -> Ring:
        if num_workers < 1 or num_slots < 1 or slot_bytes < 8:
            raise ValueError(
                f"a ring needs num_workers >= 1, num_slots >= 1, slot_bytes >= 8; got {num_workers}, "
                f"{num_slots}, {slot_bytes}"
            )
        slot_bytes = -(-slot_bytes // 8) * 8  # every slot starts 8-aligned
        memory = _new_shared_bytes(num_workers * num_slots * slot_bytes).view(
            num_workers, num_slots, slot_bytes
        )
        counts = torch.zeros((num_workers, 2), dtype=torch.int64).share_memory_()
        ring = cls(memory, counts, next(_tokens), os.getpid())
        _RINGS[ring.token] = ring
        return ring

    @property
    def num_slots(self) -> int:
        return self.memory.shape[1]

    @property
    def nbytes(self) -> int:
        return self.memory.nbytes

    def slot(self, worker: int, seq: int) -> np.ndarray:
        """The bytes of the slot that holds the worker's batch ``seq``."""
        return self._slots[worker, seq % self.num_slots]  # type: ignore[no-any-return]

    def wait_for_slot(
        self,
        worker: int,
        timeout_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        parent_pid: Callable[[], int] = os.getppid,
    ) -> int | None:
        """The sequence number of the worker's next slot once it is free, or None after ``timeout_s``;
        sleeps with backoff in between and raises ``RingStalledError`` if the main process is gone."""
        counts = self._counts[worker]
        written = int(counts[0])
        started, delay = clock(), _MIN_DELAY_S
        while written - int(counts[1]) >= self.num_slots:
            if parent_pid() != self.parent_pid:
                raise RingStalledError(
                    f"loader worker {worker}: the main process (pid {self.parent_pid}) is gone; stopping"
                )
            if clock() - started >= timeout_s:
                return None
            sleep(delay)
            delay = min(delay * 2, _MAX_DELAY_S)
        return written

    def freed(self, worker: int) -> int:
        return int(self._counts[worker, 1])

    def fits(self, pieces: list[np.ndarray]) -> bool:
        return sum(_aligned(len(p)) for p in pieces) <= int(self.memory.shape[2])

    def put(self, worker: int, seq: int, pieces: list[np.ndarray], layout: Layout) -> RingBatch:
        """Copy a batch's pieces (``split_batch``) into slot ``seq`` and mark it written."""
        target = self.slot(worker, seq)
        pos = 0
        for piece in pieces:
            target[pos : pos + len(piece)] = piece
            pos += _aligned(len(piece))
        self._counts[worker, 0] = seq + 1
        return RingBatch(self.token, worker, seq, layout)

    def take(self, worker: int, seq: int, layout: Layout) -> Batch:
        """Copy batch ``seq`` out of the worker's slot and free the slot (main process). Byte fields are
        copied into buffers reused once no batch refers to them: fresh memory for each would cost a page
        fault per 4 KiB, in the process that trains."""
        freed = int(self._counts[worker, 1])
        if seq != freed:
            raise RuntimeError(f"ring of worker {worker}: found batch {seq}, expected {freed} (out of order)")
        source = self.slot(worker, seq)
        batch, pos = Batch(), 0
        for name, kind, info in layout:
            if kind == "ragged":
                size, count = info
                buffer = self._pool.take(size)
                buffer[:] = source[pos : pos + size]
                pos += _aligned(size)
                offsets = source[pos : pos + 8 * count].view(np.int64).copy()
                pos += _aligned(8 * count)
                batch[name] = RaggedBytes(buffer.data.toreadonly(), offsets)
            elif kind == "tensor":
                dtype, shape = np.dtype(info[0]), info[1]
                size = dtype.itemsize * int(np.prod(shape))
                batch[name] = torch.from_numpy(source[pos : pos + size].view(dtype).reshape(shape).copy())
                pos += _aligned(size)
            else:
                batch[name] = info
        self._counts[worker, 1] = seq + 1
        return batch


def split_batch(batch: Batch) -> tuple[list[np.ndarray], Layout]:
    """A batch's bulk bytes as uint8 arrays in slot order, and the layout that rebuilds it around them."""
    pieces: list[np.ndarray] = []
    layout: Layout = []
    for name, value in batch.items():
        if isinstance(value, RaggedBytes):
            pieces += [np.frombuffer(value.buffer, dtype=np.uint8), value.offsets.view(np.uint8)]
            layout.append((name, "ragged", (len(value.buffer), len(value.offsets))))
        elif _fits_numpy(value):
            array = value.numpy()
            pieces.append(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
            layout.append((name, "tensor", (array.dtype.str, array.shape)))
        else:
            layout.append((name, "inline", value))  # keys, and what numpy cannot hold
    return pieces, layout


def _new_shared_bytes(size: int) -> torch.Tensor:
    """Shared memory without touching its pages (``share_memory_`` would copy a private buffer into it)."""
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)  # private: fall back if it moves
    if new_shared is None:
        memory = torch.empty(size, dtype=torch.uint8)
        memory.share_memory_()
        return memory
    storage: torch.UntypedStorage = new_shared(size)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _aligned(size: int) -> int:
    return -(-size // 8) * 8


def _fits_numpy(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.device.type == "cpu"
        and not value.requires_grad
        and value.dtype not in (torch.bfloat16, torch.complex32)  # numpy has no such dtype
    )


class RingBatch:
    """What crosses the pipe for a batch in the ring; unpickled in the main process as the batch itself."""

    __slots__ = ("args",)

    def __init__(self, token: int, worker: int, seq: int, layout: Layout) -> None:
        self.args = (token, worker, seq, layout)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _receive, self.args


def _receive(token: int, worker: int, seq: int, layout: Layout) -> Batch:
    ring = _RINGS.get(token)
    if ring is None:
        raise RuntimeError(f"a batch arrived for ring {token}, which this process no longer holds")
    return ring.take(worker, seq, layout)


@dataclass(slots=True)
class RingSender:
    """The batch path's ``collate_fn`` when the loader has a ring: in a worker it puts each batch (a
    chunk's, ``loaders.transfer.chunks``) into the ring and returns its descriptor (or the batch itself, sent
    inline). It runs in the worker's main thread, so an error here reaches the trainer as the worker's
    error, not lost in the queue's feeder thread."""

    ring: Ring
    wait_s: float = FULL_WAIT_S
    stall_s: float = STALL_WAIT_S
    _waited_s: float = field(default=0.0, repr=False)  # waiting since a free was last seen
    _freed_seen: int = field(default=-1, repr=False)

    def __call__(self, item: Any) -> Any:
        info = get_worker_info()
        if info is None:
            return item
        if isinstance(item, Chunk):
            return item if item.batch is None else item._replace(batch=self.send(info.id, item.batch))
        return self.send(info.id, item) if isinstance(item, Batch) else item

    def send(
        self,
        worker: int,
        batch: Batch,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        parent_pid: Callable[[], int] = os.getppid,
    ) -> Any:
        ring = self.ring
        pieces, layout = split_batch(batch)
        if not ring.fits(pieces):
            return batch
        started = clock()
        seq = ring.wait_for_slot(worker, self.wait_s, clock=clock, sleep=sleep, parent_pid=parent_pid)
        freed = ring.freed(worker)
        if freed != self._freed_seen:
            self._freed_seen, self._waited_s = freed, 0.0
        if seq is None:
            self._waited_s += clock() - started
            if self._waited_s >= self.stall_s:
                raise RingStalledError(
                    f"loader worker {worker}: the main process (pid {ring.parent_pid}) freed none of "
                    f"{ring.num_slots} ring slots while this worker waited {self._waited_s:.0f} s; "
                    "make_loader(..., transport='pipe') avoids the ring"
                )
            return batch
        return ring.put(worker, seq, pieces, layout)
