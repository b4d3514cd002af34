"""What every dataset read by plan shares (``ShardedDataset``, ``Mixture``): the epoch and its reseeding,
equal steps, the saved state, and how a worker's pass is planned and its samples handed out.

A subclass says what its data is (``identity``, ``epoch_size``, ``sample_bytes``), what a pass reads
(``_runs``) and how it reads it (``__iter__``, which starts from :meth:`PlannedDataset._pass_plan` and ends
in :meth:`PlannedDataset._hand_out`), and what it holds open (``close``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

from torch.utils.data import IterableDataset

from loaders.distributed.world import check_whole_batches, get_worker, planned_workers
from loaders.options import ReadOptions
from loaders.planning.elastic import Segment, consumed_count
from loaders.planning.planner import PlanConfig, batches_per_rank, samples_per_rank, worker_sample_counts
from loaders.planning.position import (
    PassPlan,
    Position,
    WorkerPass,
    check_same_worker,
    decode_state,
    decode_worker_state,
    encode_state,
    encode_worker_state,
)
from loaders.planning.stream import Samples
from loaders.reading.columns import Columns, Decoding, batches, finished_samples
from loaders.reading.decode import DecodeContext, FieldDecoder
from loaders.skips import SkipCounts
from loaders.transfer.chunks import chunks
from loaders.transfer.heap import freeze_inherited_objects
from shardpipe.formats.landing import LANDED_MIN_BYTES
from shardpipe.shardtable import ShardTable

Sample = dict[str, Any]
D = TypeVar("D", bound="PlannedDataset")
log = logging.getLogger("loaders")


class PlannedDataset(IterableDataset[Sample]):
    """Samples of ``shards`` read by plan: rank- and worker-aware, reseeded every epoch (see the module
    docstring for what a subclass adds)."""

    _worker_resume: WorkerPass | None = None  # a worker's own saved position, for its next pass
    _own_pass: WorkerPass | None = None  # this process's current pass on the per-sample path
    _own_samples = 0  # samples of that pass handed out (those skipped on resume included)

    def __init__(
        self,
        *,
        root: str,
        options: ReadOptions,
        shards: ShardTable,
        world: tuple[int, int],
        fields: tuple[str, ...],
        decoders: dict[str, FieldDecoder],
        transform: Callable[[Sample], Any] | None,
    ) -> None:
        """``root`` names the data in messages; ``world`` is ``(rank, world_size)``."""
        super().__init__()
        self.root, self.options, self.shards = root, options, shards
        self.shard_sizes = shards.num_samples  # what a plan reads, at any shard count
        self.rank, self.world_size = world
        self.fields, self.decoders, self.transform = fields, decoders, transform
        self.position = Position()
        self.skips = SkipCounts()

    def configured(self: D, **changes: Any) -> D:
        """A dataset over the same data and ``position`` with some ``ReadOptions`` changed (``make_loader``
        aligns ``batch_size`` this way); ``set_epoch`` on either reaches both."""
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.options = replace(self.options, **changes)
        return other

    # ---- what a subclass says ------------------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """What a resume state must match: the data and what seeds its order."""
        raise NotImplementedError

    def epoch_size(self, epoch: int) -> int:
        """Samples in a full ``epoch``'s sequence over all ranks, pads and drops aside."""
        raise NotImplementedError

    def sample_bytes(self) -> float:
        """A sample's mean bytes, what sizes the batch transport's slots."""
        raise NotImplementedError

    def _runs(self, epoch: int, history: tuple[Segment, ...], config: PlanConfig) -> Samples:
        """The sequence a pass of ``config``'s plan reads: the epoch's, less what ``history`` consumed."""
        raise NotImplementedError

    def close(self) -> None:
        """Close what this process opened to read (reopened lazily if read again)."""
        raise NotImplementedError

    # ---- epochs and sizes ---------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.position.epoch

    @property
    def shuffle(self) -> bool:
        return self.options.shuffle

    @property
    def batch_size(self) -> int:
        """The batch size the workers' shares are whole batches of (1 where none was given)."""
        return self.options.batch_size or 1

    def set_epoch(self, epoch: int) -> None:
        """Reseed for ``epoch``; takes effect at the next ``iter()`` in every worker.

        Moving to another epoch drops a pending resume point; setting the resumed epoch again keeps it,
        so the usual ``load_state_dict(state)`` then ``set_epoch(state["epoch"])`` resumes mid-epoch.
        """
        self.position.set_epoch(epoch)

    def plan_config(self, num_workers: int) -> PlanConfig:
        o = self.options
        return PlanConfig(
            world_size=self.world_size,
            num_workers=num_workers,
            seed=o.seed,
            shuffle=o.shuffle,
            remainder=o.remainder,
            batch_size=self.batch_size,
            block_size=o.block_size,
            shuffle_buffer=o.shuffle_buffer,
        )

    def __len__(self) -> int:
        """Samples this rank yields in a full epoch (the same on every rank)."""
        return samples_per_rank(self.epoch_size(self.epoch), self.world_size, self.options.remainder)

    def num_batches(self, batch_size: int, num_workers: int) -> int:
        """Batches every rank's ``DataLoader(dataset, batch_size, num_workers=...)`` yields in a fresh pass of
        the current epoch: ceil(len(dataset) / batch_size) where the workers' shares are whole batches (one
        worker, or ``batch_size`` given to the dataset)."""
        per_rank = samples_per_rank(self.epoch_size(self.epoch), self.world_size, self.options.remainder)
        counts = worker_sample_counts(per_rank, num_workers, self.batch_size)
        return sum(-(-n // batch_size) for n in counts)

    def pass_batches(self, epoch: int, history: tuple[Segment, ...], config: PlanConfig) -> int:
        """Batches every rank yields of ``config``'s plan for ``epoch`` after the segments of ``history``."""
        total = self._runs(epoch, history, config).size if history else self.epoch_size(epoch)
        return batches_per_rank(total, config)

    def state_extras(self, epoch: int) -> dict[str, Any]:
        """Informative entries a saved state carries besides the position (none for one dataset)."""
        return {}

    def check_state(self, state: Mapping[str, Any]) -> None:
        """Refuse a saved state this dataset cannot continue beyond what ``identity`` covers (a mixture's
        weights); one dataset has nothing more to check."""

    def state_dict(self) -> dict[str, Any]:
        """Where the run stands: small and JSON-safe. In the main process, the run's position as
        ``make_loader``'s loader handed batches out (the same on every rank; what ``loader.state_dict()``
        returns), so a loader that a trainer wrapped can be saved through its dataset. Where this object is
        iterated itself (inside a DataLoader worker, or in a loop over the dataset), that reader's own
        position: torchdata's ``StatefulDataLoader`` saves one per worker and restores each in its worker."""
        own = self._own_pass
        if own is None:
            return self.run_state()
        where = replace(own, samples=self._own_samples)
        return {**encode_worker_state(self.identity(), where), **self.state_extras(own.epoch)}

    def run_state(self) -> dict[str, Any]:
        """The run's position as the main process keeps it (see :meth:`state_dict`)."""
        epoch, segments = self.position.saved()
        return {**encode_state(self.identity(), epoch, segments), **self.state_extras(epoch)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state``, a ``state_dict()``: the next pass continues its epoch after what it consumed.

        A run's position loads on any world size, worker count and batch size (the rest of the epoch is
        re-planned where the plan differs); a worker's own position only into the same worker of the same
        plan. The data, split, seed and shuffle must be the saved run's (otherwise ``ValueError``: found X,
        expected Y, and what to do)."""
        state = dict(state)
        if "worker" in state:
            where = decode_worker_state(state, self.identity())
            self.check_state(state)
            self._worker_resume = where
            return
        epoch, segments = decode_state(state, self.identity())
        self.check_state(state)
        self.position.set_resume_point(epoch, segments)

    @property
    def num_errors(self) -> int:
        """Samples skipped as unreadable (``on_error='skip'``) in this run, over all workers."""
        return self.skips.total()

    def __enter__(self: D) -> D:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- a worker's pass ----------------------------------------------------------------------------------
    def _pass_plan(self) -> PassPlan:
        """What this worker's pass is planned from; the same for a single dataset and a mixture."""
        freeze_inherited_objects()
        worker_index, num_workers = get_worker()
        config = self.plan_config(planned_workers())
        resumed, self._worker_resume = self._worker_resume, None
        if resumed is not None:  # this worker's own saved position (StatefulDataLoader)
            check_same_worker(resumed, config, worker_index)
            epoch, history, role, skip = resumed.epoch, resumed.history, resumed.role, resumed.samples
            runs = self._runs(epoch, history, config)
        else:
            check_whole_batches(num_workers, self.options.batch_size, self.root)
            if worker_index == 0 and not self.options.managed and self.position.repeated_pass():
                log.warning(
                    "set_epoch() was not called between two passes over %s: every pass repeats epoch %d's "
                    "order. Call dataset.set_epoch(epoch) before each epoch, or read it through make_loader, "
                    "which advances the epoch itself",
                    self.root,
                    self.epoch,
                )
            epoch = self.epoch
            config, history, resumed_batches = self.position.resume_point(config)
            # The DataLoader always asks worker 0 first: after k batches, worker 0 plays the worker that
            # produced batch k in the uninterrupted run, worker 1 the next one, and so on.
            role = (worker_index + resumed_batches) % max(num_workers, 1)
            runs = self._runs(epoch, history, config)
            per_rank = samples_per_rank(runs.size, self.world_size, config.remainder)
            skip = consumed_count(config, per_rank, role, resumed_batches)
        own = WorkerPass(epoch, history, config, worker_index, role, skip)
        self._own_pass = None if self.batched else own
        self._own_samples = skip
        return PassPlan(worker_index, epoch, role, config, runs, skip)

    def _counted(self, samples: Iterator[Any]) -> Iterator[Any]:
        """The per-sample path's samples, counted for this reader's own state (``state_dict``)."""
        for sample in samples:
            self._own_samples += 1
            yield sample

    def _hand_out(self, columns: Iterator[Columns], epoch: int, worker_index: int) -> Iterator[Any]:
        """Windows' columns in yield order -> what iterating yields: batches (or chunks of them) on the
        batch path, decoded and transformed samples on the per-sample path."""
        context = DecodeContext(self.options.seed, epoch, skip=self.options.on_error == "skip")
        if self.batched:
            per_chunk = self.options.chunk_batches
            shard_paths = self.shards.paths
            count_errors = self.skips.adder(worker_index)
            decoding = Decoding(self.decoders, context, shard_paths, count_errors)
            cut = batches(columns, self.batch_size * per_chunk, decoding if self.decoders else None)
            return cut if per_chunk == 1 else chunks(cut, worker_index)
        if not self.decoders and self.transform is None:
            return self._counted(sample for window in columns for sample in window.samples())
        count_error = partial(self.skips.add, worker_index, 1)
        paths = self.shards.paths
        finished = finished_samples(columns, self.decoders, self.transform, context, paths, count_error)
        return self._counted(finished)

    @property
    def hands_over_whole_windows(self) -> bool:
        """Whether a worker hands each window over all at once (read whole, then cut into messages) rather
        than a message at a time as its pieces land, as the batch path reads large samples
        (``WindowReader``): ``make_loader`` then keeps a whole window of messages ready."""
        return not (self.batched and self.sample_bytes() >= LANDED_MIN_BYTES)

    @property
    def batched(self) -> bool:
        """Whether iterating yields whole batches (``make_loader`` without a transform, every field raw or
        with a decoder that takes a whole column) or samples."""
        batchable = all(decoder.batched for decoder in self.decoders.values())
        return self.options.batched and batchable and self.transform is None

    def count_errors(self, count: int) -> None:
        """Count ``count`` samples skipped in this process (the trainer's, for decoders that finish there)."""
        self.skips.add(get_worker()[0], count)
