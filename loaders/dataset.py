"""``ShardedDataset``: a rank-aware, worker-aware, epoch-reseeded IterableDataset over packed shards.

Each (rank, worker) reads the spans ``loaders.planner.plan_epoch`` gives it, so every rank yields exactly
``len(dataset)`` samples and the order depends only on (manifest, world size, workers, seed, epoch).
Shuffling = the planner's per-epoch span permutation + a window shuffle in the worker: consecutive windows
of ``shuffle_buffer`` samples are read (contiguous I/O) and permuted by a generator seeded from
(seed, epoch, rank, worker, window). At most one window of samples is held in memory per worker, and a
resumed run can skip exactly k samples without reading them.

The epoch lives in a shared-memory tensor created with the dataset, so ``set_epoch`` reaches DataLoader
workers whether they are persistent or not, under fork and spawn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch
from torch.utils.data import IterableDataset

from loaders.decode import Decoder, resolve_decoders
from loaders.planner import PlanConfig, Span, plan_epoch, samples_per_rank, worker_sample_counts
from loaders.world import get_worker, get_world
from shardpipe.errors import DataError
from shardpipe.formats import get_format
from shardpipe.formats.layout import ShardIndex
from shardpipe.manifest import load_manifest, manifest_path

log = logging.getLogger("loaders")

MAX_WORKERS = 256  # slots in the shared error counter
Sample = dict[str, Any]


class ShardedDataset(IterableDataset[Sample]):
    """Samples of one split of a dataset packed by ``shardpipe pack`` (tar, TFRecord or LMDB shards).

    Each sample is a dict: ``__key__``, one entry per field (raw bytes unless decoded), and ``__pad__``,
    True only for a padding duplicate (see ``remainder``), which evaluation should mask.
    """

    def __init__(
        self,
        path: str | Path,
        split: str = "train",
        *,
        shuffle: bool = True,
        seed: int = 0,
        remainder: Literal["pad", "drop"] = "pad",
        shuffle_buffer: int = 1024,
        block_size: int = 256,
        decode: str | Mapping[str, str | Decoder] | None = None,
        transform: Callable[[Sample], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        batch_size: int = 1,
    ) -> None:
        """``batch_size`` only aligns the split across workers to whole batches (``make_loader`` sets it)."""
        super().__init__()
        self.manifest = load_manifest(path)
        self.root = manifest_path(path).parent
        self.split = split
        self.shards = self.manifest.split_shards(split)
        self.shard_sizes = [s.num_samples for s in self.shards]
        self.format = get_format(self.manifest.format)
        self.rank, self.world_size = get_world(rank, world_size)
        if shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be >= 1, got {shuffle_buffer}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.shuffle, self.seed, self.remainder = shuffle, seed, remainder
        self.shuffle_buffer, self.block_size, self.batch_size = shuffle_buffer, block_size, batch_size
        self.decoders = resolve_decoders(decode, self.manifest.fields)
        self.transform = transform
        self.on_error = on_error
        self.plan_config(1)  # validate seed, remainder, sizes now rather than in a worker
        # Shared memory: written by the main process, read (and, for errors, written) by workers.
        self._epoch = torch.zeros(2, dtype=torch.int64).share_memory_()  # [epoch, set_epoch calls]
        self._skip_batches = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._errors = torch.zeros(MAX_WORKERS, dtype=torch.int64).share_memory_()
        self._indexes: dict[int, ShardIndex] = {}

    # ---- epochs and sizes ---------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        """Reseed for ``epoch``; takes effect at the next ``iter()`` in every worker.

        Moving to another epoch drops a pending resume point; setting the resumed epoch again keeps it,
        so the usual ``load_state_dict(state)`` then ``set_epoch(state["epoch"])`` resumes mid-epoch.
        """
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self._skip_batches[0] = 0
        self._epoch[0] = epoch
        self._epoch[1] += 1

    @property
    def epoch_sets(self) -> int:
        """How many times ``set_epoch`` was called: lets a loader see a pass begin without one."""
        return int(self._epoch[1])

    def plan_config(self, num_workers: int) -> PlanConfig:
        return PlanConfig(
            world_size=self.world_size,
            num_workers=num_workers,
            seed=self.seed,
            shuffle=self.shuffle,
            remainder=self.remainder,
            batch_size=self.batch_size,
            block_size=self.block_size,
        )

    def __len__(self) -> int:
        """Samples this rank yields per epoch (the same on every rank)."""
        return samples_per_rank(sum(self.shard_sizes), self.world_size, self.remainder)

    def num_batches(self, batch_size: int, num_workers: int) -> int:
        """Exact batches per epoch on every rank of a DataLoader with this batch size and worker count."""
        counts = worker_sample_counts(len(self), num_workers, self.batch_size)
        return sum(-(-n // batch_size) for n in counts)

    @property
    def num_errors(self) -> int:
        """Samples skipped as unreadable (``on_error='skip'``) in this run, over all workers."""
        return int(self._errors.sum())

    # ---- reading ------------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        worker_index, num_workers = get_worker()
        epoch, resumed_batches = self.epoch, int(self._skip_batches[0])
        # The DataLoader always asks worker 0 first: after k batches, worker 0 plays the worker that
        # produced batch k in the uninterrupted run, worker 1 the next one, and so on.
        role = (worker_index + resumed_batches) % max(num_workers, 1)
        config = self.plan_config(num_workers)
        spans = plan_epoch(self.shard_sizes, config, epoch=epoch, rank=self.rank, worker_index=role)
        skip = self._skipped_samples(resumed_batches, role, max(num_workers, 1))
        samples = self._shuffled(spans, (self.seed, epoch, self.rank, role), skip, worker_index)
        if not self.decoders and self.transform is None:
            return samples  # raw bytes: no per-sample work left
        return map(self._finish, samples)

    def _skipped_samples(self, batches: int, worker_index: int, num_workers: int) -> int:
        """Samples of this worker's stream already consumed when a run resumes after ``batches`` batches.

        The DataLoader takes batches from workers round-robin and the planner gives workers whole batches
        (the first ones one extra), so batch j always came from worker j % num_workers.
        """
        own = batches // num_workers + (worker_index < batches % num_workers)
        return own * self.batch_size

    def _shuffled(
        self, spans: list[Span], seed: tuple[int, ...], skip: int, worker_index: int
    ) -> Iterator[Sample]:
        # Windows bound the memory (one window of samples per worker) with or without shuffling.
        for window_index, window_spans in enumerate(_cut_windows(spans, self.shuffle_buffer)):
            size = sum(len(s) for s in window_spans)
            if skip >= size:  # consumed before the resume point: not even read
                skip -= size
                continue
            samples: list[Sample | None] = []
            for span in window_spans:
                self._read_span(span, worker_index, samples)
            _replace_errors(samples, self.shards, window_spans)
            if self.shuffle:
                rng = np.random.default_rng(np.random.SeedSequence([*seed, window_index]))
                samples = [samples[i] for i in rng.permutation(len(samples)).tolist()]
            yield from samples[skip:] if skip else samples  # type: ignore[misc]
            skip = 0

    def _read_span(self, span: Span, worker_index: int, out: list[Sample | None]) -> None:
        """Append one span's samples to ``out``; with on_error='skip' a bad sample becomes ``None``."""
        start = span.start
        while start < span.stop:
            try:
                self._read_range(span, start, span.stop, out)
                return
            except DataError as exc:
                if self.on_error == "raise":
                    raise
                bad = getattr(exc, "sample_index", None)
                bad = bad if bad is not None and start <= bad < span.stop else start
                log.warning(
                    "skipping unreadable sample %d of %s: %s", bad, self.shards[span.shard_index].path, exc
                )
                self._errors[worker_index % MAX_WORKERS] += 1
                if bad > start:  # the reader failed before yielding the good samples ahead of the bad one
                    self._read_range(span, start, bad, out)
                out.append(None)
                start = bad + 1

    def _read_range(self, span: Span, start: int, stop: int, out: list[Sample | None]) -> None:
        entry = self.shards[span.shard_index]
        first, is_pad, append = len(out), span.is_pad, out.append
        try:
            for key, fields in self.format.read(
                self.root / entry.path, start, stop, self._shard_index(span.shard_index)
            ):
                sample = cast(Sample, fields)  # the same dict, now also holding key and pad flag
                sample["__key__"] = key
                sample["__pad__"] = is_pad
                append(sample)
        except DataError:
            del out[first:]  # a retry re-reads the good part of the range
            raise
        if len(out) - first != stop - start:
            del out[first:]
            raise DataError(
                f"{entry.path}: yielded {len(out) - first} samples for [{start}, {stop}); truncated?"
            )

    def _shard_index(self, shard_index: int) -> ShardIndex | None:
        entry = self.shards[shard_index]
        if entry.index_path is None:
            return None
        if shard_index not in self._indexes:
            path = self.root / entry.index_path
            self._indexes[shard_index] = ShardIndex.read(
                path,
                entry.num_samples,
                self.manifest.fields,
                version=self.manifest.index_version,
                sha256=entry.index_sha256,
            )
        return self._indexes[shard_index]

    def _finish(self, sample: Sample) -> Any:
        for field, decoder in self.decoders.items():
            if field in sample:
                sample[field] = decoder(sample[field])
        return self.transform(sample) if self.transform is not None else sample

    def describe(self) -> dict[str, Any]:
        """What a resume state must match: the data, the world, and everything that shapes the order."""
        return {
            "manifest": self.manifest.fingerprint(),
            "split": self.split,
            "world_size": self.world_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "remainder": self.remainder,
            "shuffle_buffer": self.shuffle_buffer,
            "block_size": self.block_size,
            "batch_size": self.batch_size,
        }


def _cut_windows(spans: list[Span], window: int) -> Iterator[list[Span]]:
    """Regroup spans into consecutive windows of ``window`` samples (the last may be shorter)."""
    current: list[Span] = []
    room = window
    for span in spans:
        start = span.start
        while start < span.stop:
            take = min(room, span.stop - start)
            current.append(Span(span.shard_index, start, start + take, span.is_pad))
            start += take
            room -= take
            if room == 0:
                yield current
                current, room = [], window
    if current:
        yield current


def _replace_errors(samples: list[Sample | None], shards: Any, spans: list[Span]) -> None:
    """Fill each unreadable slot with a copy of a readable sample of the window, flagged as a pad."""
    if all(s is not None for s in samples):
        return
    good = next((s for s in samples if s is not None), None)
    if good is None:
        names = ", ".join(sorted({shards[s.shard_index].path for s in spans}))
        raise DataError(f"every sample of a read window in {names} is unreadable; run `shardpipe verify`")
    for i, sample in enumerate(samples):
        if sample is None:
            samples[i] = {**good, "__pad__": True}
