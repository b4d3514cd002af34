"""``make_loader``: a DataLoader over a ShardedDataset that keeps epochs and steps honest.

It aligns the workers' shares to whole batches (so ``len(loader)`` is exact and equal on every rank),
collates raw bytes into one buffer per field and batch (sent inline, see ``loaders.collate``), calls
``set_epoch`` itself at each new pass when the user never does (the forgotten-``set_epoch`` bug cannot
silently repeat one order), and saves and restores its position: resuming after k batches yields exactly
the batches k, k+1, ... of the uninterrupted run.
"""

from __future__ import annotations

import copy
import fcntl
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from loaders.collate import collate_samples
from loaders.dataset import ShardedDataset

log = logging.getLogger("loaders")
STATE_VERSION = 1


class ShardedLoader(DataLoader[Any]):
    """A DataLoader whose length is exact and whose epoch and position are managed (see the module doc)."""

    def __init__(self, dataset: ShardedDataset, batch_size: int, **kwargs: Any) -> None:
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        self.sharded = dataset
        self._pass_sets: int | None = None  # set_epoch calls seen when the previous pass began
        self._warned = False
        self._batches = 0  # batches handed out in the current epoch (including those skipped on resume)

    def __len__(self) -> int:
        return self.sharded.num_batches(self.batch_size or 1, self.num_workers)

    def _get_iterator(self) -> Any:
        iterator = super()._get_iterator()
        _enlarge_result_pipe(iterator)
        return iterator

    def set_epoch(self, epoch: int) -> None:
        self.sharded.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        forgotten = self._pass_sets is not None and self.sharded.epoch_sets == self._pass_sets
        if forgotten and self.sharded.shuffle and not int(self.sharded._skip_batches[0]):
            self.sharded.set_epoch(self.sharded.epoch + 1)
            if not self._warned:
                log.warning(
                    "set_epoch() was not called before this pass; advanced to epoch %d so the order changes "
                    "(call loader.set_epoch(epoch) or dataset.set_epoch(epoch) each epoch to choose it)",
                    self.sharded.epoch,
                )
                self._warned = True
        self._pass_sets = self.sharded.epoch_sets
        self._batches = int(self.sharded._skip_batches[0])
        for batch in super().__iter__():
            self._batches += 1
            yield batch
        self.sharded._skip_batches[0] = 0  # a resumed epoch is complete: the next pass starts at batch 0

    def state_dict(self) -> dict[str, Any]:
        """Small, JSON-safe and identical on every rank: where this epoch stands."""
        return {
            "version": STATE_VERSION,
            **self.sharded.describe(),
            "num_workers": self.num_workers,
            "epoch": self.sharded.epoch,
            "batches": self._batches,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``: the next pass continues the saved epoch after its consumed batches."""
        expected = {"version": STATE_VERSION, **self.sharded.describe(), "num_workers": self.num_workers}
        for name, value in expected.items():
            if state.get(name) != value:
                raise ValueError(
                    f"cannot resume: found {name}={state.get(name)!r} in the saved state, expected {value!r} "
                    "(this loader's). Resume with the same dataset, world size, seed, batch size and workers "
                    "as the saved run, or start the epoch afresh without load_state_dict()"
                )
        self.sharded.set_epoch(int(state["epoch"]))
        self.sharded._skip_batches[0] = int(state["batches"])
        self._pass_sets = None


RESULT_PIPE_BYTES = 1 << 20


def _enlarge_result_pipe(iterator: Any) -> None:
    """Let a worker write a whole batch into the result pipe at once (Linux; best effort).

    A batch of 64 x 1 KiB samples overflows the default 64 KiB pipe, so the worker blocks mid-batch until
    the main process drains it. Measured on 2 cores, 2 workers, batch 64, 6 interleaved pairs: 1.1-2.0x
    more samples/s with a 1 MiB pipe. The queue is DataLoader-internal, so any surprise leaves it as is.
    """
    try:
        reader = iterator._worker_result_queue._reader
        fcntl.fcntl(reader.fileno(), fcntl.F_SETPIPE_SZ, RESULT_PIPE_BYTES)
    except (AttributeError, OSError, ValueError):
        pass


def make_loader(
    dataset: ShardedDataset,
    batch_size: int,
    num_workers: int = 2,
    *,
    pin_memory: bool | None = None,
    persistent_workers: bool | None = None,
    prefetch_factor: int | None = 4,
    multiprocessing_context: str | None = None,
    **kwargs: Any,
) -> ShardedLoader:
    """A ShardedLoader with sensible defaults: pinned memory when CUDA is there, persistent workers, prefetch.

    The dataset is copied with its worker split aligned to ``batch_size``; the copy shares the original's
    epoch, so ``dataset.set_epoch`` still works.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    aligned = copy.copy(dataset)
    aligned.batch_size = batch_size
    if num_workers == 0:
        prefetch_factor = None
        persistent_workers = False
    return ShardedLoader(
        aligned,
        batch_size,
        num_workers=num_workers,
        collate_fn=kwargs.pop("collate_fn", collate_samples),
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        persistent_workers=True if persistent_workers is None else persistent_workers,
        prefetch_factor=prefetch_factor,
        multiprocessing_context=multiprocessing_context,
        **kwargs,
    )
