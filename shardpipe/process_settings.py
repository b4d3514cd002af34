"""Settings a pack process applies to itself for speed: BLAS threads, the cyclic GC, glibc's allocator.

None of them changes what a pack writes. The allocator setting is a Linux/glibc call reached through
``ctypes``, best effort: where it is missing (another libc, another OS) nothing changes but speed. The
reasons are in docs/design.md ("The pack stage").
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager

from shardpipe.storage.files import libc

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def single_threaded_blas() -> None:
    """Ask numpy's OpenBLAS for no worker threads; must run before numpy is imported.

    OpenBLAS starts a thread per core when numpy loads, in every pack process, and its idle threads spin
    before they sleep, for a pack that never calls BLAS. A value the user set wins.
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@contextmanager
def pausing_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector for the enclosed work, then restore it as it was.

    A scan builds hundreds of thousands of small objects (keys, paths, tuples) that form no cycles, and
    each allocation burst would make the collector walk all of them again. Reference counting still frees
    everything as usual.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def keep_freed_memory() -> None:
    """Let glibc keep freed memory for reuse instead of returning it to the OS after every batch.

    Writing a shard allocates and frees the same memory per batch (LMDB's dirty pages, framed records,
    header tables). By default glibc serves large blocks with fresh mappings and trims the heap as soon as
    128 KiB sit free at its top, so every batch page-faults its memory in again. Only pack processes call
    this: it raises how much freed memory a process holds (up to 256 MiB).
    """
    mallopt = getattr(libc(), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, 64 << 20)
        mallopt(_M_TRIM_THRESHOLD, 256 << 20)
