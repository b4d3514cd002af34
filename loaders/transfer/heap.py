"""A DataLoader worker's garbage collector and the heap the worker inherited from the trainer.

A forked worker starts with every object of the trainer (torch alone brings well over 100,000), and
Python's full collections walk all of them: a pause every few epochs, once enough of the worker's own
objects have survived, which also writes to pages the worker shares with the trainer, so the kernel copies
them. Freezing the inherited objects at a worker's first read (``gc.freeze``) leaves the collector only the
worker's own objects. What is frozen is never collected; the inherited objects live as long as the worker
anyway (docs/design.md, "Transfer").
"""

from __future__ import annotations

import gc
import os

import torch.utils.data

_frozen_in = -1
"""The pid that froze its inherited objects (a forked child of a worker must freeze its own)."""


def freeze_inherited_objects() -> None:
    """In a DataLoader worker, once per process: move every object now alive out of the collector's view.
    Does nothing in the main process, whose heap is the user's to manage."""
    global _frozen_in
    if _frozen_in != os.getpid() and torch.utils.data.get_worker_info() is not None:
        gc.freeze()
        _frozen_in = os.getpid()
