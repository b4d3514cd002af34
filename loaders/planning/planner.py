"""Epoch planner: which samples each (rank, worker) reads in one epoch, and in what order. Pure: no I/O.

The plan depends only on (the epoch's sequence, config, epoch, rank, worker_index), so every rank computes
its own share without talking to the others and a restarted job sees the same order on any machine.

Rules, in order (layout 3, the current one; :mod:`.stream` evaluates them a window at a time):
1. Sequence. A fresh epoch reads the shards in the order ``SeedSequence([seed, epoch])`` permutes them
   (stored order without shuffle), samples in stored order, the whole rotated by :func:`sequence_offset`
   (an offset that moves every epoch): N samples as ``runs``, rows of ``(shard, start, stop)``. A resumed
   epoch plans the same way over the samples it has left (``loaders.planning.elastic``).
2. Ranks. ``per_rank`` is ceil(N / W) with "pad", floor(N / W) with "drop". Rank r takes the positions
   [r * per_rank, (r + 1) * per_rank) of the sequence; a position p >= N reads position p mod N as a
   flagged pad; with "drop" the tail N - W * per_rank is not read (a different tail each epoch, as the
   rotation moves).
3. Blocks. With shuffle, the rank's share is cut into blocks of ``block_size`` consecutive positions and
   the blocks are permuted by a seeded bijection keyed by ``(seed, epoch, rank)``
   (``loaders.planning.permutation``): every worker draws from across the rank's whole share, so even a
   pack sorted by class mixes well. Each block is still one contiguous read (two where it crosses a
   shard's end).
4. Workers. The rank's stream is cut into contiguous parts of ``worker_sample_counts`` samples (whole
   batches), the same sizes on every rank, so every rank yields ceil(per_rank / batch_size) batches.
5. Windows. A worker's part is cut into windows of ``shuffle_buffer`` samples. With shuffle, a window's
   spans are read in shard and sample order (in one pass over its shards) and its samples yielded in a
   permutation seeded by ``SeedSequence([seed, epoch, rank, worker, window])``. A worker holds one window
   of samples at a time.

A mixture (``loaders.planning.mixture``) plans over its own sequence with ``permute_blocks=False`` (its
sources' block orders shuffle it already, and a permutation would break each part's proportions) and,
with ``balance_batches``, reorders each rank's stream so every batch holds each source within one sample
of the stream's share (``loaders.planning.balance``).

Layouts 1 and 2 are kept so states saved with them resume (:func:`written_windows` writes a worker's part
out). Layout 2 had no rotation and cut blocks at in-shard multiples of ``block_size``, permuted by
``SeedSequence([seed, epoch, rank])``; layout 1 also cut the workers' parts before the blocks and permuted
each worker's blocks with ``SeedSequence([seed, epoch, rank, worker])``.
Seeds never come from time, pid or ``hash()``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from loaders.planning.balance import balanced_batches

Remainder = Literal["pad", "drop"]
ShardSizes = Sequence[int] | np.ndarray
"""Samples per shard: a list, or an int array (a table of a million shards)."""
Runs = np.ndarray
"""``(n, 3)`` int64 rows ``(shard, start, stop)``: samples [start, stop) of a shard, in reading order."""
Blocks = np.ndarray
"""``(n, 4)`` int64 rows ``(shard, start, stop, is_pad)``."""
WindowRows = tuple[Blocks, "tuple[int, ...] | None"]
"""A window as ``(rows, seed)``: its spans as block rows in reading order, and its permutation's seed."""

DEFAULT_BLOCK_SIZE = 4
DEFAULT_SHUFFLE_BUFFER = 1024
LAYOUTS = (1, 2, 3)
LAZY_LAYOUT = 3
"""The first layout planned a window at a time (:mod:`.stream`); older ones write a worker's part out."""


@dataclass(frozen=True, slots=True)
class Span:
    """Samples [start, stop) of shard ``shard_index``; a pad span holds only padding duplicates."""

    shard_index: int
    start: int
    stop: int
    is_pad: bool = False

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class PlanConfig:
    """Everything but the sequence and (epoch, rank, worker) that shapes a plan; the same on all ranks."""

    world_size: int
    num_workers: int  # 0: the main process reads, planned as one worker
    seed: int = 0
    shuffle: bool = True
    remainder: Remainder = "pad"
    batch_size: int = 1
    block_size: int = DEFAULT_BLOCK_SIZE  # longest contiguous read the shuffle keeps in one piece
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER  # samples per window: the memory bound per worker
    layout: int = LAZY_LAYOUT
    permute_blocks: bool = True  # False for a mixture: its sequence is shuffled already (rule 3 skipped)
    balance_batches: bool = False  # a mixture's per-batch option (``loaders.planning.balance``)

    def __post_init__(self) -> None:
        _check_int("world_size", self.world_size, low=1)
        _check_int("num_workers", self.num_workers, low=0)
        _check_int("seed", self.seed, low=0)  # SeedSequence entropy must be non-negative
        _check_int("batch_size", self.batch_size, low=1)
        _check_int("block_size", self.block_size, low=1)
        _check_int("shuffle_buffer", self.shuffle_buffer, low=1)
        if self.remainder not in ("pad", "drop"):
            raise ValueError(f"remainder must be 'pad' or 'drop', got {self.remainder!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    @property
    def num_readers(self) -> int:
        """Workers that actually read per rank (num_workers 0 still means one reader)."""
        return max(self.num_workers, 1)


class Run(NamedTuple):
    """A span as the reading loop holds it: a tuple (a window holds hundreds of small spans, and a tuple
    costs no more than the list of ints it replaces), with names."""

    shard_index: int
    start: int
    stop: int
    is_pad: int
    """1 when the span holds only padding duplicates."""


@dataclass(frozen=True, slots=True)
class Window:
    """Spans read together, then yielded in ``permutation()`` order (read order when ``seed`` is None)."""

    runs: list[Run]
    seed: tuple[int, ...] | None

    def __len__(self) -> int:
        return sum(run.stop - run.start for run in self.runs)

    @property
    def spans(self) -> list[Span]:
        return [Span(run.shard_index, run.start, run.stop, bool(run.is_pad)) for run in self.runs]

    def permutation(self) -> np.ndarray:
        return window_permutation(self.seed, len(self))


def window_permutation(seed: tuple[int, ...] | None, size: int) -> np.ndarray:
    """The order a window of ``size`` samples is yielded in: read order without a seed."""
    if seed is None:
        return np.arange(size)
    return np.random.default_rng(np.random.SeedSequence(list(seed))).permutation(size)


def _check_int(name: str, value: object, *, low: int, high: int | None = None) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < low or (high is not None and value >= high):
        bound = f"[{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value}")


def samples_per_rank(total: int, world_size: int, remainder: Remainder) -> int:
    """Samples every rank reads: ceil(total / world_size) with pad, floor with drop."""
    _check_int("total", total, low=0)
    _check_int("world_size", world_size, low=1)
    if remainder == "pad":
        return -(-total // world_size)
    if remainder == "drop":
        return total // world_size
    raise ValueError(f"remainder must be 'pad' or 'drop', got {remainder!r}")


def worker_sample_counts(per_rank: int, num_workers: int, batch_size: int) -> list[int]:
    """Split one rank's samples over workers in whole batches; the last non-empty worker gets the partial one.

    The first ``num_batches % workers`` workers take one extra batch, so the sum over workers of
    ceil(count / batch_size) is ceil(per_rank / batch_size), the fewest batches possible. The DataLoader
    takes batches from workers round-robin, so batch j of a rank always comes from worker j % workers.
    """
    _check_int("per_rank", per_rank, low=0)
    _check_int("num_workers", num_workers, low=0)
    _check_int("batch_size", batch_size, low=1)
    workers = max(num_workers, 1)
    num_batches = -(-per_rank // batch_size)
    base, extra = divmod(num_batches, workers)
    counts = [(base + (w < extra)) * batch_size for w in range(workers)]
    last = workers - 1 if base > 0 else extra - 1  # last worker holding any batch
    if last >= 0:
        counts[last] -= num_batches * batch_size - per_rank
    return counts


def shard_order(num_shards: int, config: PlanConfig, epoch: int) -> list[int]:
    """The epoch's shard order; only (seed, epoch) seed it, so every rank agrees without communicating."""
    return [int(i) for i in shard_permutation(num_shards, config, epoch)]


def shard_permutation(num_shards: int, config: PlanConfig, epoch: int) -> np.ndarray:
    """:func:`shard_order` as an int64 array (a shard table may hold a million shards)."""
    _check_int("epoch", epoch, low=0)
    if not config.shuffle:
        return np.arange(num_shards, dtype=np.int64)
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, epoch]))
    return rng.permutation(num_shards).astype(np.int64, copy=False)


def epoch_runs(shard_sizes: ShardSizes, config: PlanConfig, epoch: int) -> Runs:
    """A fresh epoch's sequence: every non-empty shard, whole, in the epoch's shard order; from layout 3
    on, rotated by the epoch's offset (:func:`sequence_offset`)."""
    sizes = shard_size_array(shard_sizes)
    order = shard_permutation(len(sizes), config, epoch)
    order = order[sizes[order] > 0]
    runs = np.column_stack([order, np.zeros_like(order), sizes[order]])
    if config.layout < LAZY_LAYOUT:
        return runs
    return rotated(runs, sequence_offset(int(sizes.sum()), config, epoch))


ROTATION_STREAM = 0x726F74  # keeps the rotation's seed apart from the shard order's


def sequence_offset(total: int, config: PlanConfig, epoch: int) -> int:
    """Layout 3's rotation of the epoch's sequence: ``first + epoch * step`` mod ``total``, ``step``
    coprime to ``total``, so consecutive epochs never share one and the dropped tail visits every
    position."""
    if not config.shuffle or total <= 1:
        return 0
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, ROTATION_STREAM]))
    first, step = (int(x) for x in rng.integers(0, total, size=2))
    step = step or 1
    while math.gcd(step, total) != 1:
        step += 1
    return (first + epoch * step) % total


def rotated(runs: Runs, offset: int) -> Runs:
    """``runs`` as a sequence that starts at its position ``offset`` and wraps around."""
    if offset == 0:
        return runs
    return np.concatenate([slice_rows(runs, offset, num_samples(runs)), slice_rows(runs, 0, offset)])


def batches_per_rank(total: int, config: PlanConfig) -> int:
    """Exact number of batches one rank's DataLoader yields for a sequence of ``total`` samples."""
    per_rank = samples_per_rank(total, config.world_size, config.remainder)
    counts = worker_sample_counts(per_rank, config.num_workers, config.batch_size)
    return sum(-(-n // config.batch_size) for n in counts)


def written_windows(
    runs: Runs, config: PlanConfig, *, epoch: int, rank: int, worker_index: int
) -> list[WindowRows]:
    """Layouts 1 and 2: a worker's windows as ``(rows, seed)``, its whole part written out first."""
    check_plan_args(config, epoch, rank, worker_index)
    part = worker_part(runs, config, epoch=epoch, rank=rank, worker_index=worker_index)
    total, size = num_samples(part), config.shuffle_buffer
    bounds = [*range(0, total, size), total]
    return [
        (_reading_order(rows, config.shuffle), window_seed(config, epoch, rank, worker_index, index))
        for index, rows in enumerate(split_rows(part, bounds))
    ]


def check_plan_args(config: PlanConfig, epoch: int, rank: int, worker_index: int) -> None:
    _check_int("epoch", epoch, low=0)
    _check_int("rank", rank, low=0, high=config.world_size)
    _check_int("worker_index", worker_index, low=0, high=config.num_readers)


def window_seed(
    config: PlanConfig, epoch: int, rank: int, worker: int, window: int
) -> tuple[int, ...] | None:
    return (config.seed, epoch, rank, worker, window) if config.shuffle else None


def yield_order(windows: Sequence[Window]) -> list[tuple[int, int, bool]]:
    """``(shard, sample, is_pad)`` in the order a worker yields them: each window read, then permuted."""
    out: list[tuple[int, int, bool]] = []
    for window in windows:
        samples = [(s.shard_index, i, s.is_pad) for s in window.spans for i in range(s.start, s.stop)]
        out += [samples[i] for i in window.permutation().tolist()]
    return out


def worker_part(runs: Runs, config: PlanConfig, *, epoch: int, rank: int, worker_index: int) -> Blocks:
    """This worker's samples in reading order, windows not yet cut: ``(n, 4)`` block rows."""
    worker = worker_index
    total = num_samples(runs)
    per_rank = samples_per_rank(total, config.world_size, config.remainder)
    counts = worker_sample_counts(per_rank, config.num_workers, config.batch_size)
    share = _rank_share(runs, total, rank * per_rank, (rank + 1) * per_rank)
    first = sum(counts[:worker])
    if config.layout == 1:  # the worker's contiguous part first, then its own blocks permuted
        part = slice_rows(share, first, first + counts[worker])
        return _permuted_blocks(part, config, [config.seed, epoch, rank, worker])
    stream = _permuted_blocks(share, config, [config.seed, epoch, rank]) if config.permute_blocks else share
    if config.balance_batches:
        stream = balanced_batches(stream, config.batch_size)
    return slice_rows(stream, first, first + counts[worker])


def _rank_share(runs: Runs, total: int, begin: int, end: int) -> Blocks:
    """Positions [begin, end) of the sequence repeated without end; positions >= total are pads."""
    flagged = np.column_stack([runs, np.zeros(len(runs), np.int64)])  # (runs, 4): not pads
    pieces = [flagged[:0]]
    position = begin
    while position < end and total > 0:
        cycle = position // total
        stop = min(end, (cycle + 1) * total)
        rows = slice_rows(flagged, position % total, stop - cycle * total)
        rows[:, 3] = cycle > 0
        pieces.append(rows)
        position = stop
    return np.concatenate(pieces)


def _permuted_blocks(rows: Blocks, config: PlanConfig, entropy: list[int]) -> Blocks:
    if not config.shuffle or len(rows) == 0:
        return rows
    blocks = cut_blocks(rows, config.block_size)
    rng = np.random.default_rng(np.random.SeedSequence(entropy))
    return blocks[rng.permutation(len(blocks))]


def cut_blocks(rows: Blocks, block_size: int) -> Blocks:
    """Cut rows at in-shard multiples of ``block_size``, so blocks are the same pieces in every epoch."""
    first = rows[:, 1] // block_size
    counts = (rows[:, 2] - 1) // block_size - first + 1  # (rows,) blocks each row touches
    owner = np.repeat(np.arange(len(rows)), counts)  # (blocks,) the row each block comes from
    block = first[owner] + np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)
    out = rows[owner].copy()
    out[:, 1] = np.maximum(out[:, 1], block * block_size)
    out[:, 2] = np.minimum(out[:, 2], (block + 1) * block_size)
    return out


def slice_rows(rows: np.ndarray, begin: int, end: int) -> np.ndarray:
    """Stream positions [begin, end) of ``rows`` (columns 1 and 2 are start and stop), rows cut to fit."""
    return split_rows(rows, [begin, end])[0] if begin < end else rows[:0].copy()


def split_rows(rows: np.ndarray, bounds: Sequence[int]) -> list[np.ndarray]:
    """:func:`slice_rows` of each stream range [bounds[k], bounds[k + 1]) (bounds strictly increasing),
    the rows' ends summed once for all of them: a worker's part cut into windows costs one pass, not one a
    window (a mixture's part holds a row for nearly every sample)."""
    lengths = rows[:, 2] - rows[:, 1]
    ends = np.cumsum(lengths)  # (rows,) exclusive stream end of each row
    firsts = np.searchsorted(ends, bounds[:-1], side="right").tolist()
    lasts = np.searchsorted(ends, bounds[1:], side="left").tolist()  # the row holding position end - 1
    pieces = []
    for begin, end, first, last in zip(bounds[:-1], bounds[1:], firsts, lasts, strict=True):
        if first >= len(rows):
            pieces.append(rows[:0].copy())
            continue
        out = rows[first : last + 1].copy()
        out[0, 1] += begin - (ends[first] - lengths[first])
        out[-1, 2] -= ends[last] - end
        pieces.append(out)
    return pieces


def window_rows(part: Blocks, begin: int, end: int, shuffle: bool) -> Blocks:
    """The spans of a window, positions [begin, end) of a worker's part, in reading order (see
    :func:`_reading_order`)."""
    return _reading_order(slice_rows(part, begin, end), shuffle)


def _reading_order(rows: Blocks, shuffle: bool) -> Blocks:
    """A window's spans in reading order. Shuffled, that is by shard then sample (the window's permutation
    decides the order samples are yielded in); unshuffled, the part's own order, which is also the yield
    order."""
    return rows[np.lexsort((rows[:, 3], rows[:, 1], rows[:, 0]))] if shuffle else rows


def num_samples(rows: np.ndarray) -> int:
    return int((rows[:, 2] - rows[:, 1]).sum())


def shard_size_array(shard_sizes: ShardSizes) -> np.ndarray:
    """Non-negative ints as an int64 array (a bool or a float is refused, not rounded); an integer array
    is checked at once, a list item by item."""
    if isinstance(shard_sizes, np.ndarray) and shard_sizes.dtype.kind in "iu":
        sizes = shard_sizes.astype(np.int64).reshape(-1)
        if len(sizes) and sizes.min() < 0:
            index = int(np.argmax(sizes < 0))
            raise ValueError(f"shard_sizes[{index}] must be a non-negative int, got {sizes[index]}")
        return sizes
    for index, size in enumerate(shard_sizes):
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 0:
            raise ValueError(f"shard_sizes[{index}] must be a non-negative int, got {size!r}")
    return np.array(shard_sizes, dtype=np.int64).reshape(-1)
