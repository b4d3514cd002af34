"""A pack worker ends itself when the pack's driver dies, whatever it is doing.

A pool worker blocks on a queue whose write end it holds itself, so a driver killed outright (SIGKILL,
the OOM killer, a preempted node) would leave it waiting forever, re-parented to init, holding its
memory. :func:`exit_with_driver`, run first in every worker, ties the worker's life to the driver's:

* On Linux, when the worker's parent is the driver (the ``fork`` and ``spawn`` start methods), the kernel
  kills it when the driver dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``), even in the middle of C code.
  The kernel watches the *thread* that started the worker: the pool starts its workers from the thread
  that submits to it, which is the thread of the ``pack`` call, alive as long as the pool.
* Otherwise a daemon thread blocks on multiprocessing's sentinel of the driver (readable once the
  driver is gone) and then kills the process. That covers ``forkserver``, whose workers are children of
  the fork server, which does not end before them (each worker holds the pipe it watches), and systems
  without ``prctl`` (macOS). The thread sleeps in the kernel: nothing is polled, nothing costs per task.

A driver that died before the watch was set up is seen at once. Either way the worker ends as a SIGKILL
ends it, with no clean-up: a half-written shard stays a temporary file, which ``--resume`` removes.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from multiprocessing.connection import wait

from shardpipe.storage.files import libc

_PR_SET_PDEATHSIG = 1


def exit_with_driver() -> None:
    """Make this process end when the process that started it through multiprocessing ends; nothing in
    a process multiprocessing did not start (a Ray worker, whose job's end Ray handles)."""
    driver = multiprocessing.parent_process()
    if driver is None:
        return
    if os.getppid() == driver.pid and _kill_me_with_parent():
        if os.getppid() != driver.pid:  # the driver died before the kernel was asked
            _end()
        return
    watch = threading.Thread(target=_end_after, args=(driver.sentinel,), name="shardpipe-driver-watch")
    watch.daemon = True
    watch.start()


def _kill_me_with_parent() -> bool:
    """Ask the kernel for SIGKILL when the parent (thread) ends; False where that cannot be asked."""
    if not sys.platform.startswith("linux"):
        return False
    prctl = getattr(libc(), "prctl", None)
    if prctl is None:
        return False
    zero = ctypes.c_ulong(0)
    return int(prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), zero, zero, zero)) == 0


def _end_after(sentinel: int) -> None:
    wait([sentinel])
    _end()


def _end() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
