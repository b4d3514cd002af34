"""Epoch planner: which samples each (rank, worker) reads in one epoch. Pure: no I/O, no torch.

The plan depends only on (shard sizes, config, epoch, rank, worker_index), so every rank computes its own
share without talking to the others and a restarted job sees the same order on any machine.

Rules, in order:
1. Global sequence: the shard order is permuted by ``SeedSequence([seed, epoch])`` (identity without
   shuffle), shards are concatenated in that order, samples inside a shard keep their stored order. N is the
   total sample count; empty shards contribute nothing.
2. Ranks: ``per_rank`` is ceil(N / W) with "pad", floor(N / W) with "drop". Rank r takes the contiguous
   positions [r * per_rank, (r + 1) * per_rank). With "pad", a position p >= N reads sample p mod N of the
   global sequence and is emitted in an ``is_pad`` span; with "drop" the tail N - W * per_rank is skipped
   (a different tail each epoch when shuffling).
3. Workers: the rank's slice is cut into contiguous sub-slices in whole batches (``worker_sample_counts``),
   the same sizes on every rank, so the rank yields the minimal ceil(per_rank / batch_size) batches.
4. Local shuffle: with shuffle, a worker's spans are cut at ``block_size``-aligned positions inside their
   shard and the pieces are permuted by ``SeedSequence([seed, epoch, rank, worker_index])``; every piece is
   still one contiguous read.

Invariants (tests/test_planner.py checks each): every rank gets exactly ``per_rank`` samples with identical
per-worker counts; over all ranks each sample appears once among non-pad spans plus W * per_rank - N pads
(or minus N - W * per_rank drops); each worker reads one contiguous run of the global sequence (wrapping
at most once), so it touches few shards. Seeds never come from time, pid or ``hash()``.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Remainder = Literal["pad", "drop"]


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
    """Everything but the shard sizes and (epoch, rank, worker) that shapes a plan; the same on all ranks."""

    world_size: int
    num_workers: int  # 0: the main process reads, planned as one worker
    seed: int = 0
    shuffle: bool = True
    remainder: Remainder = "pad"
    batch_size: int = 1
    block_size: int = 256  # longest contiguous read the local shuffle keeps in one piece

    def __post_init__(self) -> None:
        _check_int("world_size", self.world_size, low=1)
        _check_int("num_workers", self.num_workers, low=0)
        _check_int("seed", self.seed, low=0)  # SeedSequence entropy must be non-negative
        _check_int("batch_size", self.batch_size, low=1)
        _check_int("block_size", self.block_size, low=1)
        if self.remainder not in ("pad", "drop"):
            raise ValueError(f"remainder must be 'pad' or 'drop', got {self.remainder!r}")

    @property
    def num_readers(self) -> int:
        """Workers that actually read per rank (num_workers 0 still means one reader)."""
        return max(self.num_workers, 1)


def _check_int(name: str, value: object, *, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
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
    ceil(count / batch_size) is ceil(per_rank / batch_size), the fewest batches possible.
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
    if not config.shuffle:
        return list(range(num_shards))
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, epoch]))
    return [int(i) for i in rng.permutation(num_shards)]


def batches_per_rank(shard_sizes: Sequence[int], config: PlanConfig) -> int:
    """Exact number of batches one rank's DataLoader yields per epoch (identical on every rank)."""
    per_rank = samples_per_rank(sum(_sizes(shard_sizes)), config.world_size, config.remainder)
    counts = worker_sample_counts(per_rank, config.num_workers, config.batch_size)
    return sum(-(-n // config.batch_size) for n in counts)


def plan_epoch(
    shard_sizes: Sequence[int], config: PlanConfig, *, epoch: int, rank: int, worker_index: int
) -> list[Span]:
    """Spans this (rank, worker) reads in ``epoch``, in read order."""
    _check_int("epoch", epoch, low=0)
    _check_int("rank", rank, low=0, high=config.world_size)
    _check_int("worker_index", worker_index, low=0, high=config.num_readers)
    sizes = _sizes(shard_sizes)
    total = sum(sizes)
    per_rank = samples_per_rank(total, config.world_size, config.remainder)
    counts = worker_sample_counts(per_rank, config.num_workers, config.batch_size)
    begin = rank * per_rank + sum(counts[:worker_index])
    end = begin + counts[worker_index]

    order = [i for i in shard_order(len(sizes), config, epoch) if sizes[i] > 0]
    ends = np.cumsum([sizes[i] for i in order]).tolist()  # (len(order),) exclusive ends; ends[-1] == N
    spans: list[Span] = []
    pos = begin
    while pos < end:  # walk the global positions, splitting at wraps (multiples of N) and shard ends
        real = pos % total
        k = bisect.bisect_right(ends, real)
        shard_start = ends[k] - sizes[order[k]]
        take = min(end - pos, ends[k] - real)
        spans.append(Span(order[k], real - shard_start, real - shard_start + take, is_pad=pos >= total))
        pos += take
    if not config.shuffle:
        return spans
    pieces = [piece for span in spans for piece in _split_blocks(span, config.block_size)]
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, epoch, rank, worker_index]))
    return [pieces[int(i)] for i in rng.permutation(len(pieces))]


def _split_blocks(span: Span, block_size: int) -> list[Span]:
    """Cut at in-shard multiples of block_size, so pieces align with the same blocks in every epoch."""
    cuts = [span.start, *range((span.start // block_size + 1) * block_size, span.stop, block_size), span.stop]
    return [Span(span.shard_index, a, b, span.is_pad) for a, b in itertools.pairwise(cuts)]


def _sizes(shard_sizes: Sequence[int]) -> list[int]:
    """Plain non-negative ints, so spans never carry numpy scalars into JSON state or logs."""
    for index, size in enumerate(shard_sizes):
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 0:
            raise ValueError(f"shard_sizes[{index}] must be a non-negative int, got {size!r}")
    return [int(size) for size in shard_sizes]
