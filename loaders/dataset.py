"""``ShardedDataset``: a rank-aware, worker-aware, epoch-reseeded IterableDataset over packed shards.

Each (rank, worker) reads the windows ``loaders.planning.plan.plan_windows`` gives it, so every rank yields
exactly ``len(dataset)`` samples and the order depends only on (manifest, world size, workers, seed,
epoch). A window's spans are read by ``loaders.reading.windows`` (which applies ``on_error``), then yielded
in its seeded permutation: one window of samples is held per worker. A resumed pass skips the samples
consumed before the save without reading them.

The epoch and the resume point live in ``loaders.planning.position.Position`` (shared memory), so
``set_epoch`` reaches DataLoader workers whether they are persistent or not, under fork and spawn.
``state_dict`` / ``load_state_dict`` save and restore the run's position (what ``make_loader``'s loader
handed out) in the main process, and one worker's own position inside a DataLoader worker, as torchdata's
``StatefulDataLoader`` asks for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from loaders.distributed.world import check_whole_batches, get_worker, get_world, planned_workers
from loaders.options import ReadOptions, selected_fields
from loaders.planning.elastic import Segment, consumed_count, epoch_samples
from loaders.planning.mixing import default_block_size, warn_if_poorly_mixed
from loaders.planning.plan import plan_windows, skip_whole_windows
from loaders.planning.planner import (
    DEFAULT_SHUFFLE_BUFFER,
    PlanConfig,
    Remainder,
    batches_per_rank,
    samples_per_rank,
    worker_sample_counts,
)
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
from loaders.reading.decode import ColumnDecoder, DecodeContext, Decoder, resolve_decoders
from loaders.reading.readers import ShardReaders
from loaders.reading.source import DatasetSource, RemoteOptions
from loaders.reading.windows import OnError, WindowReader
from loaders.skips import SkipCounts
from loaders.transfer.chunks import chunks
from loaders.transfer.heap import freeze_inherited_objects
from shardpipe.formats import get_format
from shardpipe.formats.landing import LANDED_MIN_BYTES
from shardpipe.manifest import Manifest

Sample = dict[str, Any]
log = logging.getLogger("loaders")


class ShardedDataset(IterableDataset[Sample]):
    """Samples of one split of a dataset packed by ``shardpipe pack`` (tar, TFRecord or LMDB shards).

    Each sample is a dict: ``__key__``, one entry per field (raw bytes unless decoded), and ``__pad__``,
    True only for a padding duplicate (see ``remainder``), which evaluation should mask.
    """

    _worker_resume: WorkerPass | None = None  # a worker's own saved position, for its next pass
    _own_pass: WorkerPass | None = None  # this process's current pass on the per-sample path
    _own_samples = 0  # samples of that pass handed out (those skipped on resume included)

    def __init__(
        self,
        path: str | Path,
        split: str = "train",
        *,
        shuffle: bool = True,
        seed: int = 0,
        remainder: Remainder = "pad",
        shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
        block_size: int | None = None,
        batch_size: int | None = None,
        fields: Sequence[str] | None = None,
        decode: str | Mapping[str, str | Decoder | ColumnDecoder] | None = None,
        transform: Callable[[Sample], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        on_error: OnError = "raise",
        check: bool = True,
        remote: RemoteOptions | None = None,
    ) -> None:
        """``path`` is a dataset folder, its manifest, or a URL of either (``s3://``, ``gs://``,
        ``https://``): remote shards are read through a per-node cache, as ``remote`` says (credentials,
        the cache folder and budget, prefetch; :class:`~loaders.reading.source.RemoteOptions`).
        ``check=False`` skips the per-sample checksums (and the index's sha256).

        ``block_size=None`` picks by the pack order: a hashed pack (what ``shardpipe pack`` writes by
        default) is mixed already and reads blocks of ``HASHED_BLOCK_SIZE`` samples (long reads, fast); a
        sorted pack, or one whose order is unknown, reads blocks of ``DEFAULT_BLOCK_SIZE`` from all over
        each rank's share, so its batches still mix classes.

        ``batch_size`` is the batch size of a plain ``DataLoader`` (or torchdata's ``StatefulDataLoader``)
        that reads this dataset with two or more workers: each worker's share is then whole batches, so the
        loader's ``len`` is exact and equal on every rank. ``make_loader`` sets it itself.

        ``fields`` reads only these fields (default: every field of the manifest); the others are never
        copied or decoded, though each sample's checksum still covers its whole record."""
        super().__init__()
        self.source = DatasetSource(path, remote)
        self.manifest: Manifest = self.source.manifest
        self.root = self.source.display
        if block_size is None:
            block_size = default_block_size(self.manifest)
        self.options = ReadOptions(
            split=split,
            shuffle=shuffle,
            seed=seed,
            remainder=remainder,
            shuffle_buffer=shuffle_buffer,
            block_size=block_size,
            batch_size=batch_size,
            on_error=on_error,
            check=check,
        )
        self.shards = self.manifest.split_shards(split)
        self.shard_sizes: np.ndarray = self.shards.num_samples  # what a plan reads, at any shard count
        self._sequences: dict[tuple[int, tuple[Segment, ...], PlanConfig], Samples] = {}
        self.format = get_format(self.manifest.format)
        self.rank, self.world_size = get_world(rank, world_size)
        self.fields = selected_fields(self.manifest, fields, self.root)
        self.decoders = resolve_decoders(decode, self.fields, self.manifest.label_fields)
        self.transform = transform
        self.position = Position()
        self.skips = SkipCounts()
        self._readers = self._new_readers()
        warn_if_poorly_mixed(self.manifest, self.options, self.root)

    def configured(self, **changes: Any) -> ShardedDataset:
        """A dataset over the same data and ``position`` with some ``ReadOptions`` changed (``make_loader``
        aligns ``batch_size`` this way); ``set_epoch`` on either reaches both."""
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.options = replace(self.options, **changes)
        other._readers = other._new_readers()
        return other

    def _new_readers(self) -> ShardReaders:
        return ShardReaders(self.source, self.shards, self.format, check=self.options.check)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_readers"] = None  # open files and environments never cross into a worker
        state["_sequences"] = {}  # a worker plans its own pass
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._readers = self._new_readers()

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

    def epoch_size(self, epoch: int) -> int:
        """Samples in a full ``epoch``'s sequence over all ranks, pads and drops aside."""
        return int(self.shard_sizes.sum())

    def sample_bytes(self) -> float:
        """A sample's mean bytes in the shards (framing included), as the manifest has them: what sizes the
        batch transport's slots."""
        return int(self.shards.num_bytes.sum()) / max(int(self.shard_sizes.sum()), 1)

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

    def identity(self) -> dict[str, Any]:
        """What a resume state must match: the data and what seeds its order."""
        return {
            "manifest": self.manifest.fingerprint(),
            "split": self.options.split,
            "seed": self.options.seed,
            "shuffle": self.options.shuffle,
        }

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

    def close(self) -> None:
        """Close the shard files and environments this process opened (reopened lazily if read again),
        and stop prefetching."""
        self._readers.close()
        self.source.close()

    def __enter__(self) -> ShardedDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- reading ------------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        plan = self._pass_plan()
        planned = plan_windows(
            plan.runs, plan.config, epoch=plan.epoch, rank=self.rank, worker_index=plan.role
        )
        windows, skip = skip_whole_windows(planned, plan.skip, plan.config.shuffle_buffer)
        if self.source.remote:  # the shards this worker reads, in order: the cache prefetches by it
            order = [run.shard_index for window in windows for run in window.runs]
            self.source.plan([self.shards[i] for k, i in enumerate(order) if k == 0 or order[k - 1] != i])
        reader = WindowReader(
            readers=self._readers,
            fields=self.fields,
            shard_paths=self.shards.paths,
            on_error=self.options.on_error,
            count_errors=self.skips.adder(plan.worker_index),
            piece_size=self.batch_size * self.options.chunk_batches if self.batched else None,
        )
        return self._hand_out(reader.read(windows, skip), plan.epoch, plan.worker_index)

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

    def _runs(self, epoch: int, history: tuple[Segment, ...], config: PlanConfig) -> Samples:
        """The sequence a pass of ``config``'s plan reads: the epoch's, less what ``history`` consumed
        (kept for the last few passes: ``len`` and the pass both ask for it)."""
        key = (epoch, history, config)
        if key not in self._sequences:
            while len(self._sequences) >= 4:
                self._sequences.pop(next(iter(self._sequences)))
            self._sequences[key] = epoch_samples(self.shard_sizes, config, history, epoch)
        return self._sequences[key]
