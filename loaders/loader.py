"""``make_loader``: a DataLoader over a ShardedDataset or Mixture that keeps epochs, steps and resumes honest.

It aligns the workers' shares to whole batches (so ``len(loader)`` is exact and equal on every rank),
collates raw bytes into one buffer per field and batch, sends small batches several to a worker message
(``loaders.transfer.chunks``), inline (``loaders.transfer.collate``) or through a shared-memory ring
(``loaders.transfer.transport``), and keeps the epochs: a pass is complete once it handed out every
planned batch, whether or not its consumer pulled ``StopIteration`` (trainers stop at ``len(loader)``),
and a new pass without ``set_epoch`` starts the next epoch (the forgotten-``set_epoch`` bug cannot
silently repeat one order). It saves and restores its position (``state_dict`` / ``load_state_dict``,
the protocol torchdata's ``StatefulDataLoader`` users know): resumed with the same world size, workers
and batch size it yields exactly the batches k, k+1, ... of the uninterrupted run; resumed on another
world it re-plans the rest of the epoch (``loaders.planning.elastic``).
"""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from loaders.planned import PlannedDataset
from loaders.planning.position import PassProgress
from loaders.reading.decode import ColumnDecoder, DecodeContext, DecodeError
from loaders.transfer.chunks import interleave
from loaders.transfer.collate import collate_samples
from loaders.transfer.sizing import TransferSizes, transfer_sizes
from loaders.transfer.transport import Ring, RingSender, Transport, shm_free_bytes

log = logging.getLogger("loaders")
RESULT_PIPE_BYTES = 1 << 20


class ShardedLoader(DataLoader[Any]):
    """A DataLoader whose length is exact and whose epoch and position are managed (see the module doc)."""

    # Accelerate's prepare() rebuilds a DataLoader over an IterableDataset so that one rank's batches are
    # split among all ranks; each rank here reads its own share already. Accelerate passes a loader it
    # marked prepared through unchanged (tests/test_recipes.py runs it, so a release that stops noticing
    # this fails there).
    _is_accelerate_prepared = True

    def __init__(
        self,
        dataset: PlannedDataset,
        batch_size: int,
        *,
        enlarge_pipe: bool = True,
        transport: Transport = "auto",
        **kwargs: Any,
    ) -> None:
        workers = kwargs.get("num_workers", 0)
        # Workers' shares are whole batches (an exact len); this loader keeps the epochs.
        dataset = dataset.configured(batch_size=batch_size, managed=True)
        self.sizes: TransferSizes = transfer_sizes(
            workers=workers,
            batch_size=batch_size,
            batch_bytes=expected_batch_bytes(dataset, batch_size),
            window=dataset.plan_config(workers).shuffle_buffer,
            batched=dataset.batched,
            whole_windows=dataset.hands_over_whole_windows,
            prefetch_factor=kwargs.get("prefetch_factor"),
            transport=transport,
            shm_free=shm_free_bytes() if workers else 0,
        )
        if workers > 0:
            kwargs["prefetch_factor"] = self.sizes.prefetch_factor
        if dataset.batched:  # the workers build whole batches: the DataLoader only forwards them
            kwargs["collate_fn"] = _forward
            dataset = dataset.configured(chunk_batches=self.sizes.per_message)
            super().__init__(dataset, batch_size=None, **kwargs)
        else:
            super().__init__(dataset, batch_size=batch_size, **kwargs)
        self.sharded = dataset
        self.samples_per_batch = batch_size
        self.enlarge_pipe = enlarge_pipe
        self._warned = False

    def __len__(self) -> int:
        """The epoch's batches on every rank, as trainers count them: for a resumed epoch those the saved run
        consumed plus what the pass yields (Lightning restores its own count of the first and stops at
        ``len``). The pass in progress, or else the next one."""
        return (self.sharded.position.current() or self._next_pass()).length

    def _get_iterator(self) -> Any:
        ring = self._make_ring()
        if ring is not None:  # the workers take the ring with their collate_fn; the iterator keeps it alive
            self.collate_fn = RingSender(ring)
        try:
            iterator = super()._get_iterator()
        finally:
            if ring is not None:
                self.collate_fn = _forward
        if self.enlarge_pipe and self.num_workers > 0:
            enlarge_result_pipe(iterator)
        return iterator

    def expected_batch_bytes(self) -> float:
        """A batch's bytes as the manifest predicts them (shard bytes per sample, framing included)."""
        return expected_batch_bytes(self.sharded, self.samples_per_batch)

    def _make_ring(self) -> Ring | None:
        """A ring for the workers about to start, as the loader's sizes planned it (``None``: the pipe)."""
        if self.sizes.ring is None:
            return None
        slots, slot_bytes = self.sizes.ring
        return Ring.create(self.num_workers, slots, slot_bytes)

    def set_epoch(self, epoch: int) -> None:
        self.sharded.set_epoch(epoch)

    def _next_pass(self) -> PassProgress:
        """The pass the next ``iter()`` begins, without beginning it."""
        position = self.sharded.position
        epoch, config = position.epoch, self.sharded.plan_config(self.num_workers)
        config, history, batches = position.resume_point(config)
        previous = position.current()  # begun since the last set_epoch or load: this pass needs none
        if previous is not None and (previous.complete or not (history or batches)):
            epoch, history, batches = epoch + 1, (), 0  # a new pass is a new epoch
            config = self.sharded.plan_config(self.num_workers)
        planned = self.sharded.pass_batches(epoch, history, config)
        return PassProgress(epoch, position.epoch_sets, history, config, batches, planned)

    def _begin_pass(self) -> PassProgress:
        """Begin the next pass: the next epoch where the last pass needed no ``set_epoch`` (logged once when
        the order is shuffled); an abandoned resumed pass is replayed from its resume point."""
        position = self.sharded.position
        progress = self._next_pass()
        if progress.epoch != position.epoch:
            position.set_epoch(progress.epoch)
            if self.sharded.shuffle and not self._warned:
                log.warning(
                    "set_epoch() was not called before this pass; advanced to epoch %d so the order changes "
                    "(call loader.set_epoch(epoch) or dataset.set_epoch(epoch) each epoch to choose it)",
                    position.epoch,
                )
                self._warned = True
            progress.sets = position.epoch_sets
        position.progress = progress
        return progress

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        progress = self._begin_pass()
        batches: Iterator[Any] = super().__iter__()
        if self.sharded.options.chunk_batches > 1:
            batches = interleave(batches, self.num_workers, self.samples_per_batch)
        finishing = {name: d.column for name, d in self.sharded.decoders.items() if d.column.finishes}
        for batch in batches:
            progress.batches += 1  # the last planned batch completes the pass, whatever comes next
            yield finish_batch(batch, finishing, self.sharded) if finishing else batch

    def state_dict(self) -> dict[str, Any]:
        """Small, JSON-safe and identical on every rank: the data, the epoch and the position in it (after a
        complete pass, the next epoch's start)."""
        return self.sharded.run_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``: the next pass continues the saved epoch after what it consumed.

        Any world size, worker count and batch size may load it; the data, split, seed and shuffle must
        be the saved run's (otherwise ``ValueError``: found X, expected Y, and what to do).
        """
        if "worker" in state:
            raise ValueError(
                "cannot resume: this is one DataLoader worker's state (torchdata's StatefulDataLoader saves "
                "those); load it into that StatefulDataLoader, or save loader.state_dict() of this loader"
            )
        self.sharded.load_state_dict(state)


def _forward(batch: Any) -> Any:
    return batch


def finish_batch(batch: Any, finishing: dict[str, ColumnDecoder], dataset: PlannedDataset) -> Any:
    """A batch's fields whose decoders finish in the trainer process (device crops), finished; a sample
    that fails there is named, or, under ``on_error="skip"``, flagged as a pad and counted."""
    context = DecodeContext(skip=dataset.options.on_error == "skip")
    for name, decoder in finishing.items():
        context.failed.clear()
        try:
            batch[name] = decoder.finish(batch[name], context)
        except DecodeError as exc:
            key = batch["__key__"][exc.index]
            raise DecodeError(
                f"cannot decode field {name!r} of sample {key!r} (in the trainer process): {exc.detail}",
                index=exc.index,
                detail=exc.detail,
            ) from exc
        for index, _ in context.failed:
            batch["__pad__"][index] = True
        if context.failed:
            dataset.count_errors(len(context.failed))
    return batch


def expected_batch_bytes(dataset: PlannedDataset, batch_size: int) -> float:
    """A batch's bytes as the manifest predicts them (shard bytes per sample, framing included), plus what
    decoders that produce a fixed size add (an image crop's pixels, which dwarf a small JPEG)."""
    decoded = sum(getattr(d.column, "output_bytes", 0) for d in dataset.decoders.values())
    return (dataset.sample_bytes() + decoded) * batch_size


def enlarge_result_pipe(iterator: Any) -> bool:
    """Let a worker write a whole batch into the result pipe at once (Linux); return whether it did.

    A batch of small samples overflows the default 64 KiB pipe, so the worker blocks mid-batch until the
    main process drains it. The pipe belongs to DataLoader's private queue: when a torch release moves it,
    this logs once and the loader runs on the plain pipe (``tests/test_loader.py`` fails, so we notice).
    """
    try:
        reader = iterator._worker_result_queue._reader
        fcntl.fcntl(reader.fileno(), fcntl.F_SETPIPE_SZ, RESULT_PIPE_BYTES)
        return True
    except (AttributeError, OSError, ValueError) as exc:
        _warn_pipe_once(exc)
        return False


_pipe_warned = False


def _warn_pipe_once(exc: Exception) -> None:
    global _pipe_warned
    if not _pipe_warned:
        log.info("could not enlarge the DataLoader result pipe (%s); using the default pipe", exc)
        _pipe_warned = True


def make_loader(
    dataset: PlannedDataset,
    batch_size: int,
    num_workers: int = 2,
    *,
    pin_memory: bool | None = None,
    persistent_workers: bool | None = None,
    prefetch_factor: int | None = None,
    multiprocessing_context: str | None = None,
    enlarge_pipe: bool = True,
    transport: Transport = "auto",
    **kwargs: Any,
) -> ShardedLoader:
    """A ShardedLoader with sensible defaults: pinned memory when CUDA is there, persistent workers, and
    (``prefetch_factor=None``) what a worker hands over at once kept ready (``sizing.prefetch_for``).

    It reads a dataset configured with its worker split aligned to ``batch_size``, sharing the given
    dataset's position, so ``dataset.set_epoch`` still works. When fields stay raw bytes (no decoder,
    transform or ``collate_fn``) the workers build whole batches from columns
    (``loaders.reading.columns``): the same batches, without a dict per sample. ``enlarge_pipe=False`` keeps
    DataLoader's plain result pipe (see ``enlarge_result_pipe``). ``transport`` says how the batch path's
    batches reach the main process: ``"pipe"`` pickled through the result pipe, ``"ring"`` through a
    shared-memory ring per worker (``loaders.transfer.transport``), ``"auto"`` the ring when the manifest
    predicts batches of at least ``AUTO_MIN_BATCH_BYTES`` and /dev/shm has room.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if num_workers == 0:
        prefetch_factor = None
        persistent_workers = False
    collate_fn = kwargs.pop("collate_fn", None)
    return ShardedLoader(
        dataset.configured(batched=collate_fn is None),
        batch_size,
        num_workers=num_workers,
        collate_fn=collate_fn or collate_samples,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        persistent_workers=True if persistent_workers is None else persistent_workers,
        prefetch_factor=prefetch_factor,
        multiprocessing_context=multiprocessing_context,
        enlarge_pipe=enlarge_pipe,
        transport=transport,
        **kwargs,
    )
