"""``ShardedDataset``: a rank-aware, worker-aware, epoch-reseeded IterableDataset over packed shards.

Each (rank, worker) reads the windows ``loaders.planning.plan.plan_windows`` gives it, so every rank yields
exactly ``len(dataset)`` samples and the order depends only on (manifest, world size, workers, seed,
epoch). A window's spans are read by ``loaders.reading.windows`` (which applies ``on_error``), then yielded
in its seeded permutation: one window of samples is held per worker. A resumed pass skips the samples
consumed before the save without reading them.

What it shares with a ``Mixture`` (:mod:`loaders.planned`): the epoch and the resume point live in
``loaders.planning.position.Position`` (shared memory), so ``set_epoch`` reaches DataLoader workers whether
they are persistent or not, under fork and spawn. ``state_dict`` / ``load_state_dict`` save and restore the
run's position (what ``make_loader``'s loader handed out) in the main process, and one worker's own
position inside a DataLoader worker, as torchdata's ``StatefulDataLoader`` asks for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from loaders.distributed.world import get_world
from loaders.options import ReadOptions, selected_fields
from loaders.planned import PlannedDataset
from loaders.planning.elastic import Segment, epoch_samples
from loaders.planning.mixing import default_block_size, warn_if_poorly_mixed
from loaders.planning.plan import plan_windows, skip_whole_windows
from loaders.planning.planner import DEFAULT_SHUFFLE_BUFFER, PlanConfig, Remainder
from loaders.planning.stream import Samples
from loaders.reading.decode import ColumnDecoder, Decoder, resolve_decoders
from loaders.reading.readers import ShardReaders
from loaders.reading.source import DatasetSource, RemoteOptions
from loaders.reading.windows import OnError, WindowReader
from shardpipe.formats import get_format
from shardpipe.manifest import Manifest

Sample = dict[str, Any]


class ShardedDataset(PlannedDataset):
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
        self.source = DatasetSource(path, remote)
        self.manifest: Manifest = self.source.manifest
        if block_size is None:
            block_size = default_block_size(self.manifest)
        options = ReadOptions(
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
        root = self.source.display
        selected = selected_fields(self.manifest, fields, root)
        super().__init__(
            root=root,
            options=options,
            shards=self.manifest.split_shards(split),
            world=get_world(rank, world_size),
            fields=selected,
            decoders=resolve_decoders(decode, selected, self.manifest.label_fields),
            transform=transform,
        )
        self._sequences: dict[tuple[int, tuple[Segment, ...], PlanConfig], Samples] = {}
        self.format = get_format(self.manifest.format)
        self._readers = self._new_readers()
        warn_if_poorly_mixed(self.manifest, self.options, self.root)

    def configured(self, **changes: Any) -> ShardedDataset:
        other = super().configured(**changes)
        other._readers = other._new_readers()  # its own, for its own check setting
        return other

    @property
    def readers(self) -> ShardReaders:
        """The shard readers this process holds open (a mixture reads its sources through theirs)."""
        return self._readers

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

    def epoch_size(self, epoch: int) -> int:
        """Samples in a full ``epoch``'s sequence over all ranks, pads and drops aside."""
        return int(self.shard_sizes.sum())

    def sample_bytes(self) -> float:
        """A sample's mean bytes in the shards (framing included), as the manifest has them: what sizes the
        batch transport's slots."""
        return int(self.shards.num_bytes.sum()) / max(int(self.shard_sizes.sum()), 1)

    def identity(self) -> dict[str, Any]:
        """What a resume state must match: the data and what seeds its order."""
        return {
            "manifest": self.manifest.fingerprint(),
            "split": self.options.split,
            "seed": self.options.seed,
            "shuffle": self.options.shuffle,
        }

    def close(self) -> None:
        """Close the shard files and environments this process opened (reopened lazily if read again),
        and stop prefetching."""
        self._readers.close()
        self.source.close()

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

    def _runs(self, epoch: int, history: tuple[Segment, ...], config: PlanConfig) -> Samples:
        """The sequence a pass of ``config``'s plan reads: the epoch's, less what ``history`` consumed
        (kept for the last few passes: ``len`` and the pass both ask for it)."""
        key = (epoch, history, config)
        if key not in self._sequences:
            while len(self._sequences) >= 4:
                self._sequences.pop(next(iter(self._sequences)))
            self._sequences[key] = epoch_samples(self.shard_sizes, config, history, epoch)
        return self._sequences[key]
