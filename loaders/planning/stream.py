"""Layout 3: the plan computed a window at a time, in memory bounded by the window, at any epoch size.
Pure: no I/O.

The rules of :mod:`.planner` hold; what changes is how they are evaluated:
1. Sequence. An epoch's sequence is the shards in the epoch's order, the whole rotated by an offset that
   moves every epoch (``planner.sequence_offset``: a different tail is dropped, and one shard's order
   changes, each epoch); a position is looked up through the shards' prefix sums (:class:`ShardSequence`).
2. Ranks. Rank r's share is positions [r * per_rank, (r + 1) * per_rank) of the sequence repeated
   without end; a position p >= N is a flagged pad of p mod N.
3. Blocks. With shuffle, the share is cut into blocks of ``block_size`` consecutive positions, permuted
   by a seeded bijection (:class:`~.permutation.BlockPermutation`, entropy ``(seed, epoch, rank)``):
   position x of the rank's stream is computed on its own, never the whole permutation.
4. Workers and windows as in :mod:`.planner`: a worker's part is a range of the rank's stream, cut into
   windows of ``shuffle_buffer``; each window's spans come from its positions when it is read
   (:class:`WindowPlan`, handed out as a :class:`Computed` sequence).
A resumed epoch's sequence is what the saved segments left (``loaders.planning.elastic.RestSequence``),
a function from position to sample too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, TypeVar, overload

import numpy as np

from loaders.planning.balance import balanced_order
from loaders.planning.permutation import BlockPermutation
from loaders.planning.planner import (
    Blocks,
    PlanConfig,
    Run,
    Runs,
    ShardSizes,
    Window,
    WindowRows,
    samples_per_rank,
    sequence_offset,
    shard_permutation,
    shard_size_array,
    window_seed,
    worker_sample_counts,
)

T = TypeVar("T")


class Samples(Protocol):
    """An epoch's sequence, or what is left of it: ``size`` positions, each naming one sample."""

    @property
    def size(self) -> int: ...

    def take(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, sample)`` at sorted-or-not ``positions`` (int64, each in [0, size))."""
        ...


@dataclass
class RunsSequence:
    """A sequence written out as runs ``(shard, start, stop)``: what layouts 1 and 2 plan over."""

    runs: Runs

    @cached_property
    def _ends(self) -> np.ndarray:
        return np.cumsum(self.runs[:, 2] - self.runs[:, 1])

    @property
    def size(self) -> int:
        return int(self._ends[-1]) if len(self.runs) else 0

    def take(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        row = np.searchsorted(self._ends, positions, side="right")
        lengths = self.runs[row, 2] - self.runs[row, 1]
        return self.runs[row, 0], self.runs[row, 1] + positions - (self._ends[row] - lengths)


class ShardSequence:
    """A fresh epoch's sequence (rule 1) without its runs written out: the non-empty shards in the
    epoch's order and the prefix sums of their sizes, one int64 each a shard, and the rotation. The same
    positions as ``RunsSequence(epoch_runs(...))``."""

    def __init__(self, shard_sizes: ShardSizes, config: PlanConfig, epoch: int) -> None:
        sizes = shard_size_array(shard_sizes)
        order = shard_permutation(len(sizes), config, epoch)
        ordered = sizes[order]
        if len(ordered) and ordered.min() == 0:  # empty shards hold no position
            order, ordered = order[ordered > 0], ordered[ordered > 0]
        self.order = order
        self.ends = np.cumsum(ordered)
        self._size = int(self.ends[-1]) if len(self.ends) else 0
        self.offset = sequence_offset(self._size, config, epoch)

    @property
    def size(self) -> int:
        return self._size

    def take(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rotated = (positions + self.offset) % max(self._size, 1)
        index = np.searchsorted(self.ends, rotated, side="right")
        return self.order[index], rotated - np.where(index > 0, self.ends[index - 1], 0)


@dataclass(frozen=True)
class RankStream:
    """Rank ``rank``'s stream over a sequence (rules 2-3): ``per_rank`` positions."""

    sequence: Samples
    config: PlanConfig
    epoch: int
    rank: int

    @cached_property
    def per_rank(self) -> int:
        return samples_per_rank(self.sequence.size, self.config.world_size, self.config.remainder)

    @cached_property
    def blocks(self) -> BlockPermutation:
        config = self.config
        entropy = (config.seed, self.epoch, self.rank) if config.shuffle and config.permute_blocks else None
        return BlockPermutation(self.per_rank, config.block_size, entropy)

    @cached_property
    def balanced(self) -> np.ndarray | None:
        """A per-batch mixture's stream order (``loaders.planning.balance``): the one plan that holds its
        rank's whole stream, ``per_rank`` positions, as that composition is decided batch by batch."""
        if not self.config.balance_batches:
            return None
        every = self.rank * self.per_rank + self.blocks.source(np.arange(self.per_rank, dtype=np.int64))
        source, _ = self.sequence.take(every % max(self.sequence.size, 1))
        return balanced_order(source, self.config.batch_size)

    def sequence_positions(self, positions: np.ndarray) -> np.ndarray:
        """Positions of the endless sequence (>= size: pads) shown at stream ``positions``."""
        if self.balanced is not None:
            positions = self.balanced[positions]
        return self.rank * self.per_rank + self.blocks.source(positions)

    def take(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(shard, sample, is_pad)`` at stream ``positions``."""
        where = self.sequence_positions(positions)
        size = max(self.sequence.size, 1)
        shard, sample = self.sequence.take(where % size)
        return shard, sample, (where >= size).astype(np.int64)

    def pad_positions(self) -> np.ndarray:
        """The stream positions of this rank's pads, sorted (fewer than the world size over all ranks)."""
        real = min(max(self.sequence.size - self.rank * self.per_rank, 0), self.per_rank)
        pads = self.blocks.stream(np.arange(real, self.per_rank, dtype=np.int64))
        if self.balanced is not None:
            pads = np.flatnonzero(np.isin(self.balanced, pads))
        return np.sort(pads)


def reading_order(shard: np.ndarray, sample: np.ndarray, is_pad: np.ndarray, shuffle: bool) -> np.ndarray:
    """The order a window's samples are read in: by shard and sample when shuffled, as given otherwise."""
    if not shuffle:
        return np.arange(len(shard))
    if len(shard) and shard.max() < 1 << 21 and sample.max() < 1 << 40:  # one int64 key sorts faster
        return np.argsort((shard << 41) | (sample << 1) | is_pad, kind="stable")
    return np.lexsort((is_pad, sample, shard))


def spans_of(shard: np.ndarray, sample: np.ndarray, is_pad: np.ndarray, shuffle: bool) -> Blocks:
    """Samples as ``(n, 4)`` block rows in reading order: by shard and sample when shuffled (the window's
    permutation orders the yield), in the given order otherwise; consecutive samples joined."""
    order = reading_order(shard, sample, is_pad, shuffle)
    shard, sample, is_pad = shard[order], sample[order], is_pad[order]
    new = np.ones(len(shard), dtype=bool)
    new[1:] = (shard[1:] != shard[:-1]) | (is_pad[1:] != is_pad[:-1]) | (sample[1:] != sample[:-1] + 1)
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(shard))
    return (
        np.column_stack([shard[starts], sample[starts], sample[ends - 1] + 1, is_pad[starts]])
        .astype(np.int64)
        .reshape(-1, 4)
    )


class Computed(Sequence[T]):
    """``length`` items, item i computed by ``item(i)`` each time it is asked for: a plan's windows
    without the plan written out."""

    def __init__(self, length: int, item: Callable[[int], T]) -> None:
        self.length, self.item = length, item

    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...
    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        if isinstance(index, slice):
            return [self.item(i) for i in range(*index.indices(self.length))]
        if not -self.length <= index < self.length:
            raise IndexError(index)
        return self.item(index % self.length)


class WindowPlan:
    """One (rank, worker)'s part of its rank's stream, and each of its windows on demand."""

    def __init__(self, sequence: Samples, config: PlanConfig, *, epoch: int, rank: int, worker_index: int):
        self.stream = RankStream(sequence, config, epoch, rank)
        self.config, self.epoch, self.rank, self.worker = config, epoch, rank, worker_index
        counts = worker_sample_counts(self.stream.per_rank, config.num_workers, config.batch_size)
        self.first, self.length = sum(counts[:worker_index]), counts[worker_index]

    @property
    def num_windows(self) -> int:
        return -(-self.length // self.config.shuffle_buffer)

    def positions(self, index: int) -> np.ndarray:
        """The stream positions of window ``index``."""
        size = self.config.shuffle_buffer
        begin = self.first + index * size
        return np.arange(begin, min(begin + size, self.first + self.length), dtype=np.int64)

    def rows(self, index: int) -> WindowRows:
        """Window ``index`` as ``(rows, seed)``, rows ``(n, 4)`` in reading order."""
        config = self.config
        seed = window_seed(config, self.epoch, self.rank, self.worker, index)
        shard, sample, is_pad = self.stream.take(self.positions(index))
        return spans_of(shard, sample, is_pad, config.shuffle), seed

    def window(self, index: int) -> Window:
        rows, seed = self.rows(index)
        return Window(list(map(Run._make, rows.tolist())), seed)
