"""``Mixture``: several ``ShardedDataset`` sources read as one, at exact proportions, usable wherever a
``ShardedDataset`` is (``make_loader``, ``set_epoch``, ``state_dict`` / ``load_state_dict``, the sync
checks, the monitor): both are a :class:`~loaders.planned.PlannedDataset`, and a mixture reads each
source through that source's own readers.

The epoch's sequence comes from the pure mixture planner (``loaders.planning.mixture``): exact per-source
counts, a low-discrepancy schedule, and each source's own reshuffled passes continued across epochs. Ranks,
workers and windows are contiguous cuts of it (``loaders.planning.planner`` with ``permute_blocks=False``),
so they inherit its proportions; a resumed epoch re-plans what is left (``loaders.planning.elastic``).
Every sample carries ``__source__``, its source's index in ``names``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from loaders.dataset import ShardedDataset
from loaders.mixture_sources import checked_sources
from loaders.options import ReadOptions
from loaders.planned import PlannedDataset
from loaders.planning.elastic import Segment
from loaders.planning.mixture import (
    SourceTable,
    continued_origin,
    cursor_runs,
    first_cursors,
    remaining_samples,
    source_position,
)
from loaders.planning.plan import skip_whole_windows, window_blocks
from loaders.planning.planner import (
    LAZY_LAYOUT,
    Blocks,
    PlanConfig,
    Run,
    Runs,
    Window,
    WindowRows,
    num_samples,
    window_permutation,
)
from loaders.planning.stream import Samples, spans_of
from loaders.planning.weights import EpochMix, WeightSchedule, epoch_mix, epoch_weights
from loaders.reading.columns import Columns
from loaders.reading.mixed import by_source, read_order
from loaders.reading.mixed_landing import SourcePart, land_pieces
from loaders.reading.windows import OnError, WindowReader, piece_ends
from shardpipe.errors import DataError
from shardpipe.shardtable import ShardTable

Locate = Callable[[int, int, int], Runs]
"""``(source, begin, end) -> rows``: a source's real rows for a stretch of its global cursor."""


class Mixture(PlannedDataset):
    """Samples of several sources at fixed proportions; each sample dict also holds ``__source__``.

    ``weights`` map each source name to a fraction (normalised) or an int (an absolute count per epoch);
    a list of such mappings (epoch e uses item ``min(e, len - 1)``) or a function of the epoch changes them
    at epoch boundaries, and :class:`~loaders.planning.weights.Stages` within an epoch.
    ``samples_per_epoch`` defaults to the sum of the sources' sizes. ``per_batch=True`` gives every batch
    each source within one sample of its share. Sources must agree on fields (``ShardedDataset(...,
    fields=...)`` reads the ones they share), decoders, transform, shuffle and remainder; their own seeds
    are not used (``seed`` seeds the whole mixture).
    """

    def __init__(
        self,
        sources: Mapping[str, ShardedDataset],
        weights: WeightSchedule,
        *,
        samples_per_epoch: int | None = None,
        per_batch: bool = False,
        seed: int = 0,
        batch_size: int | None = None,
    ) -> None:
        """``batch_size`` as for ``ShardedDataset``: a plain ``DataLoader``'s, where one with two or more
        workers reads the mixture (``make_loader`` sets it)."""
        datasets = checked_sources(sources)
        first = datasets[0]
        if samples_per_epoch is not None and (
            isinstance(samples_per_epoch, bool)
            or not isinstance(samples_per_epoch, int)
            or samples_per_epoch < 1
        ):
            raise ValueError(f"samples_per_epoch must be an int >= 1 or None, got {samples_per_epoch!r}")
        if not isinstance(per_batch, bool):
            raise TypeError(f"per_batch must be a bool, got {per_batch!r}")
        self.names: tuple[str, ...] = tuple(sources)
        self.datasets: tuple[ShardedDataset, ...] = datasets
        self.weights, self.samples_per_epoch, self.per_batch = weights, samples_per_epoch, per_batch
        self.sizes = tuple(int(d.shard_sizes.sum()) for d in datasets)
        on_error: OnError = "skip" if all(d.options.on_error == "skip" for d in datasets) else "raise"
        options = ReadOptions(
            split="+".join(f"{n}:{d.options.split}" for n, d in zip(self.names, datasets, strict=True)),
            shuffle=first.options.shuffle,
            seed=seed,
            remainder=first.options.remainder,
            shuffle_buffer=min(d.options.shuffle_buffer for d in datasets),
            block_size=1,
            batch_size=batch_size,
            on_error=on_error,
            check=first.options.check,
        )
        super().__init__(
            root=f"the mixture of {', '.join(self.names)}",
            options=options,
            shards=ShardTable.concat([d.shards for d in datasets]),
            world=(first.rank, first.world_size),
            fields=first.fields,
            decoders=first.decoders,
            transform=first.transform,
        )
        block_sizes = [d.options.block_size for d in datasets]
        self._sources = SourceTable.of(
            [d.shard_sizes for d in datasets], block_sizes, first.options.shuffle, seed
        )
        self.shard_offsets = tuple(int(x) for x in np.cumsum([0, *(len(d.shards) for d in datasets)])[:-1])
        self._mixes: dict[int, EpochMix] = {}
        self._origin: tuple[int, tuple[int, ...]] | None = None  # (epoch, cursors) of a changed mix
        for epoch in range(len(weights) if isinstance(weights, Sequence) else 1):
            self.mix(epoch)  # checks every listed epoch's weights now, not in a worker

    # ---- the plan ------------------------------------------------------------------------------------------
    def mix(self, epoch: int) -> EpochMix:
        """The exact composition of ``epoch``: each source's count per stage."""
        if epoch not in self._mixes:
            weights = epoch_weights(self.weights, epoch)
            self._mixes[epoch] = epoch_mix(weights, self.names, self.sizes, self.samples_per_epoch)
        return self._mixes[epoch]

    def cursors(self, epoch: int) -> tuple[int, ...]:
        """Each source's global cursor at the start of ``epoch``: its samples in all earlier epochs (since
        the epoch a changed mix continued from, see :meth:`continue_passes`)."""
        if self._origin is None:
            return first_cursors([self.mix(e) for e in range(epoch)], len(self.names))
        first, start = self._origin
        if epoch < first:
            raise ValueError(
                f"epoch {epoch} is before epoch {first}, where this mixture continues a saved run"
            )
        later = first_cursors([self.mix(e) for e in range(first, epoch)], len(self.names))
        return tuple(a + b for a, b in zip(start, later, strict=True))

    def continue_passes(self, state: Mapping[str, Any]) -> int:
        """Change the mix of a saved run: continue each source's pass, with this mixture's weights, from
        the epoch after the saved one, as if that epoch had been read whole; returns that epoch (pass it
        to ``set_epoch``). The same sources must be mixed; do not ``load_state_dict`` the old state."""
        expected = self.identity()
        for name in ("names", "manifest", "split"):
            if state.get(name) != expected[name]:
                raise ValueError(
                    f"cannot continue: found {name}={state.get(name)!r} in the saved state, expected "
                    f"{expected[name]!r} (this mixture's); continue a run of the same sources"
                )
        self._origin = continued_origin(state, self.names, self.sizes)
        return self._origin[0]

    def epoch_size(self, epoch: int) -> int:
        return self.mix(epoch).num_samples

    def sample_bytes(self) -> float:
        """A sample's mean bytes at the mixture's proportions (its sources' means weighted by their counts),
        the most over the stages of the epochs planned so far: a mixture's batches hold its large-sample
        sources at their weight, not at their share of the files."""
        means = [d.sample_bytes() for d in self.datasets]
        stages = [stage for mix in (*self._mixes.values(), self.mix(self.epoch)) for stage in mix.stages]
        return max(
            sum(n * mean for n, mean in zip(stage.counts, means, strict=True)) / max(stage.num_samples, 1)
            for stage in stages
        )

    def plan_config(self, num_workers: int) -> PlanConfig:
        return replace(
            super().plan_config(num_workers),
            shuffle_buffer=self.batch_size if self.per_batch else self.options.shuffle_buffer,
            permute_blocks=False,
            balance_batches=self.per_batch,
        )

    def _runs(self, epoch: int, history: tuple[Segment, ...], config: PlanConfig) -> Samples:
        layout = history[0].config.layout if history else config.layout
        return remaining_samples(self.mix(epoch), self.options.seed, history, epoch, layout)

    # ---- state ---------------------------------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "manifest": {n: d.manifest.fingerprint() for n, d in zip(self.names, self.datasets, strict=True)},
            "split": {n: d.options.split for n, d in zip(self.names, self.datasets, strict=True)},
            "seed": self.options.seed,
            "shuffle": self.options.shuffle,
            "per_batch": self.per_batch,
        }

    def state_extras(self, epoch: int) -> dict[str, Any]:
        """The epoch's composition, and where each source's pass stood when the epoch began."""
        cursors = self.cursors(epoch)
        origin = {} if self._origin is None else {"origin": [self._origin[0], list(self._origin[1])]}
        return {
            **origin,
            "mix": self.mix(epoch).to_json(),
            "sources": {
                name: source_position(cursor, size)
                for name, cursor, size in zip(self.names, cursors, self.sizes, strict=True)
            },
        }

    def check_state(self, state: Mapping[str, Any]) -> None:
        """Refuse a state whose epoch this mixture would compose otherwise (other weights or sizes)."""
        epoch = int(state["epoch"])
        if "origin" in state:  # a run that changed its mix: its passes continue from there
            first, start = state["origin"]
            self._origin = (int(first), tuple(int(c) for c in start))
        expected = self.state_extras(epoch)
        for name in ("mix", "sources"):
            if name in state and state[name] != expected[name]:
                raise ValueError(
                    f"cannot resume: found {name}={state[name]!r} in the saved state, expected "
                    f"{expected[name]!r} (this mixture's for epoch {epoch}). Resume with the saved run's "
                    "sources, weights and samples_per_epoch, or start the epoch afresh without "
                    "load_state_dict()"
                )

    def close(self) -> None:
        for dataset in self.datasets:
            dataset.close()

    # ---- reading -------------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        plan = self._pass_plan()
        planned = window_blocks(
            plan.runs, plan.config, epoch=plan.epoch, rank=self.rank, worker_index=plan.role
        )
        windows, skip = skip_whole_windows(planned, plan.skip, plan.config.shuffle_buffer)
        locate = partial(self._locate, plan.config.layout)
        if any(d.source.remote for d in self.datasets):
            self._plan_remote([rows for rows, _ in windows], plan.epoch, locate)
        columns = self._read(windows, skip, plan.epoch, plan.worker_index, locate, plan.config.layout)
        return self._hand_out(columns, plan.epoch, plan.worker_index)

    def _locate(self, layout: int, source: int, begin: int, end: int) -> Runs:
        """Source ``source``'s real ``(shard, start, stop)`` rows for its global cursors [begin, end)."""
        options, seed = self.datasets[source].options, self.options.seed
        if layout >= LAZY_LAYOUT:
            return self._sources.rows(source, begin, end)
        sizes = self.datasets[source].shard_sizes
        return cursor_runs(sizes, options.block_size, options.shuffle, seed, source, begin, end)

    def _plan_remote(self, windows: Sequence[Blocks], epoch: int, locate: Locate) -> None:
        """Tell each remote source's cache the shards this worker reads, in order, so it prefetches: the
        worker's real samples of a source are one stretch of its cursor (pads re-read a few)."""
        cursors = self.cursors(epoch)
        every = np.concatenate([np.zeros((0, 4), dtype=np.int64), *windows])
        for source, d in enumerate(self.datasets):
            rows = every[(every[:, 0] == source) & (every[:, 3] == 0)]
            if not d.source.remote or not len(rows):
                continue
            begin = cursors[source] + int(rows[:, 1].min())
            end = cursors[source] + int(rows[:, 2].max())
            found = locate(source, begin, end)
            order = found[:, 0].tolist()
            d.source.plan([d.shards[i] for k, i in enumerate(order) if k == 0 or order[k - 1] != i])

    def _read(
        self,
        windows: Sequence[WindowRows],
        skip: int,
        epoch: int,
        worker_index: int,
        locate: Locate,
        layout: int,
    ) -> Iterator[Columns]:
        count_errors = self.skips.adder(worker_index)
        readers = [
            WindowReader(
                readers=d.readers,
                fields=self.fields,
                shard_paths=d.shards.paths,
                on_error=d.options.on_error,
                count_errors=count_errors,
            )
            for d in self.datasets
        ]
        cursors = self.cursors(epoch)
        yielded = 0
        for rows, seed in windows:
            size = num_samples(rows)
            if skip >= size:
                skip -= size
                continue
            order = read_order(rows)[window_permutation(seed, size)[skip:]]
            grouped = self._source_runs(rows, cursors, locate, layout)
            for columns in self._window(grouped, order, readers, yielded):
                yielded += len(columns)
                yield columns
            skip = 0

    def _source_runs(
        self, rows: Blocks, cursors: Sequence[int], locate: Locate, layout: int
    ) -> list[tuple[int, list[Run]]]:
        """Each source of the window (in order of first appearance) and the runs of its samples, in the
        order :func:`~loaders.reading.mixed.read_order` undoes: in layout 3 every source's samples are
        located in one vectorised pass (:class:`~loaders.planning.mixture.SourceTable`)."""
        groups = by_source(rows)
        if not groups:
            return []
        if layout < LAZY_LAYOUT:
            grouped = []
            for source, joined in groups.items():
                real: list[Run] = []
                for _, j0, j1, is_pad in joined.tolist():
                    found = locate(source, cursors[source] + j0, cursors[source] + j1)
                    real += [Run(int(s), int(a), int(b), is_pad) for s, a, b in found.tolist()]
                grouped.append((source, real))
            return grouped
        joined = np.concatenate(list(groups.values()))
        lengths = joined[:, 2] - joined[:, 1]
        owner = np.repeat(joined[:, 0], lengths)  # each sample's source
        j = np.repeat(joined[:, 1] - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
        shard, sample = self._sources.locate(owner, np.asarray(cursors, dtype=np.int64)[owner] + j)
        pad = np.repeat(joined[:, 3], lengths)
        bounds = np.flatnonzero(np.diff(owner, prepend=-1, append=-1)).tolist()
        out = []
        for a, b in itertools.pairwise(bounds):
            spans = spans_of(shard[a:b], sample[a:b], pad[a:b], shuffle=False)
            out.append((int(owner[a]), list(map(Run._make, spans.tolist()))))
        return out

    def _window(
        self,
        grouped: list[tuple[int, list[Run]]],
        order: np.ndarray,
        readers: Sequence[WindowReader],
        yielded: int,
    ) -> Iterator[Columns]:
        """The window at ``order``: landed in one copy (:mod:`~loaders.reading.mixed_landing`), in pieces
        that end where messages do on the batch path; what was not landed read source by source and
        gathered (where the window cannot be landed, or a piece fails under ``on_error="skip"``: that path
        finds the bad samples)."""
        parts, first = [], 0
        for source, runs in grouped:
            count = sum(run.stop - run.start for run in runs)
            mine = (order >= first) & (order < first + count)
            first += count
            if not mine.any():
                continue  # a resumed window's rest may hold none of a source: nothing to locate
            d = self.datasets[source]
            parts.append(
                SourcePart(
                    source,
                    d.readers,
                    runs,
                    order[mine] - (first - count),
                    np.flatnonzero(mine),
                    self.shard_offsets[source],
                )
            )
        bounds = [len(order)]
        if self.batched:
            bounds = piece_ends(len(order), self.batch_size * self.options.chunk_batches, yielded)
        landed = 0
        try:
            for piece in land_pieces(parts, self.fields, len(order), bounds):
                landed += len(piece)
                yield piece
        except DataError:
            if self.datasets[0].options.on_error == "raise":
                raise
        if landed < len(order):
            yield Columns.gather(self.fields, self._read_window(grouped, readers), order[landed:])

    def _read_window(
        self, grouped: list[tuple[int, list[Run]]], readers: Sequence[WindowReader]
    ) -> list[Columns]:
        """Each source's samples of the window, each source read in one call."""
        pieces = []
        for source, real in grouped:
            size = sum(run.stop - run.start for run in real)
            columns = readers[source].read_window(Window(real, None), np.arange(size))
            offset = self.shard_offsets[source]
            columns.shards = [offset + shard for shard in columns.shards] if columns.shards else []
            columns.sources = [source] * len(columns)
            pieces.append(columns)
        return pieces
