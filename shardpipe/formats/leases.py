"""Buffers leased to what is cut from them, and returned to their pool when the last of that is gone: the
one rule by which a buffer is reused, for landed samples (:mod:`.landing`) and for the batches a trainer
copies out of shared memory (``loaders.transfer``).

A fresh buffer of a few MiB comes from the kernel as zeroed pages, which costs a page fault and a write per
4 KiB before the copy writes it again; a buffer that was used before does not. Nothing here counts
references: a lease is an array with a finaliser, so a batch a user keeps is never overwritten. A leaf: it
imports nothing of the formats.
"""

from __future__ import annotations

import weakref

import numpy as np

POOLED_BUFFERS = 8
"""Landing buffers a thread keeps for reuse (:class:`BufferPool`)."""
POOLED_BYTES = 64 << 20
"""Bytes of landing buffers a thread keeps for reuse: a window of large samples is landed whole (a mixture's,
random access) and may be far larger than a batch."""


class BufferPool:
    """Landing buffers, each leased to what is cut from it and returned when the last of that is gone.

    A fresh buffer of a few MiB comes from the kernel as zeroed pages, which costs a page fault and a
    write per 4 KiB before the copy writes it again; a buffer that was used before does not. A pooled
    buffer is handed out as a new array over its memory, the lease: every column, tensor, Arrow buffer
    or view cut from it refers to that array (NumPy views keep the array they were cut from as their
    base), so a finaliser on it returns the buffer exactly when nothing can read it any more. A batch a
    user keeps therefore keeps its buffer out of the pool, on any interpreter; nothing here counts
    references. One pool per thread (a lease may end in any thread).
    """

    def __init__(self, max_buffers: int = POOLED_BUFFERS, max_bytes: int = POOLED_BYTES) -> None:
        """The pool keeps at most ``max_buffers`` buffers of ``max_bytes`` in all."""
        self._buffers: list[np.ndarray] = []
        self._leased: set[int] = set()  # ids of the pooled buffers whose leases live
        self._max_buffers, self._max_bytes = max_buffers, max_bytes

    def take(self, size: int) -> np.ndarray:
        """``size`` bytes (uint8), not zeroed. An idle buffer of the smallest size that fits, of those the
        one taken last, the likeliest to be in the CPU cache still; buffers are made in powers of two, so
        that requests of about one size share them (a mixture's pieces vary). Idle buffers go first, least
        recently taken first, to make room within the pool's bounds; a buffer that would not fit is handed
        out unpooled (freed with its last column)."""
        buffers, most, most_bytes = self._buffers, self._max_buffers, self._max_bytes
        idle = [i for i in range(len(buffers)) if id(buffers[i]) not in self._leased]
        fitting = [i for i in idle if len(buffers[i]) >= size]
        if fitting:
            smallest = min(len(buffers[i]) for i in fitting)
            taken = max(i for i in fitting if len(buffers[i]) == smallest)
            buffers.append(buffers.pop(taken))  # kept in the order they were taken
            return self._lease(buffers[-1], size)
        made = _rounded(size) if _rounded(size) <= most_bytes else size
        for removed, i in enumerate(idle):
            if len(buffers) < most and sum(map(len, buffers)) + made <= most_bytes:
                break
            del buffers[i - removed]
        if len(buffers) >= most or sum(map(len, buffers)) + made > most_bytes:
            return np.empty(size, np.uint8)
        buffers.append(np.empty(made, np.uint8))
        return self._lease(buffers[-1], size)

    def _lease(self, buffer: np.ndarray, size: int) -> np.ndarray:
        """The first ``size`` bytes of a pooled ``buffer`` as a new array, the buffer leased until that
        array and everything cut from it are gone (a leased buffer stays in the pool, so its id is not
        reused meanwhile)."""
        key = id(buffer)
        self._leased.add(key)
        lease = np.frombuffer(buffer.data[:size], np.uint8)
        weakref.finalize(lease, self._leased.discard, key).atexit = False
        return lease


def _rounded(size: int) -> int:
    """``size`` rounded up to a power of two: the buffer's tail is never touched unless a larger request
    takes it, so the rounding costs address space, not memory."""
    return 1 << max(size - 1, 0).bit_length()
