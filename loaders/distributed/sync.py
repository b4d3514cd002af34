"""Turn unequal step counts and missing ranks into errors that name ranks, instead of a hung all-reduce.

In DDP every rank must issue the same collectives in the same order. A rank with one batch fewer leaves its
peers blocked in the last all-reduce until the process group's timeout (30 min by default for gloo, the
NCCL watchdog's 10 min), with no word about which rank or why. Three tools, all run over a private gloo
group created with *our* timeout (cached per group and timeout), so they work under NCCL too and never
interleave with the training's own collectives:

- `validate_dataloader_sync(loader)`: all-gathers every rank's `len(loader)` before the epoch and raises
  `StepCountMismatchError` on every rank, listing every rank's count, if they differ.
- `epoch_barrier(timeout)`: `monitored_barrier(wait_all_ranks=True)`; raises `RankTimeoutError`. Gloo's
  monitored barrier is a star around group rank 0: rank 0 learns which ranks did not arrive and its error
  names them (`missing_ranks`); any other rank only learns that rank 0 did not release it, so its error
  names rank 0's report as the place to look (`missing_ranks` is None there).
- `guarded(loader, timeout)`: yields the loader's batches. Before the first batch it runs the length check
  (when the loader has a length); before every batch it agrees with all ranks over the private group that
  every rank has a batch (one 8-byte all-gather per step); after the last batch it runs `epoch_barrier`.

What the guard catches, and what it cannot:

- Planned counts that differ (`len(loader)` differs): caught before the first batch, on every rank.
- Actual counts that differ (an iterable loader with no length, or one whose length is wrong): with the
  per-step check (the default) caught at the first step some rank cannot take, on every rank, naming the
  ranks that ran out and after how many batches. Nothing hangs, because the check runs *before* the step's
  own collectives: every rank takes part in it whether or not it has a batch.
- Without the per-step check (`check_steps=False`) a rank that runs out goes to the end-of-epoch barrier
  while its peers sit in the step's all-reduce. Only that early rank can report: after `timeout` its barrier
  raises `RankTimeoutError` (stating how many batches it took). Its peers stay blocked in the training's
  collective until that rank's process exits (gloo then fails them with "Connection closed by peer") or
  their own process-group timeout fires (NCCL); no code on their side runs in between, so none can name it.
- A rank hung or crashed mid-epoch (stuck in I/O, killed): with the per-step check the other ranks fail
  within `timeout` at that step with `RankTimeoutError`; gloo's all-gather does not say which peer was
  missing, so they say the step instead. The end-of-epoch barrier names missing ranks (on rank 0).
- A hang inside the training step itself (a collective issued by only some ranks, a deadlocked kernel) is
  outside the loader and outside what this module sees; only the process group's own timeout covers it.

All functions are collectives over the group: call them on every rank, in the same order. The private gloo
group is created on first use, itself a collective bounded only by the default group's timeout: `guarded`
creates it before the first batch; if you call `epoch_barrier` alone, call it (or
`validate_dataloader_sync`) once at start-up, when every rank is surely there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from shardpipe.errors import ShardpipeError

__all__ = [
    "RankTimeoutError",
    "StepCountMismatchError",
    "epoch_barrier",
    "guarded",
    "validate_dataloader_sync",
]

T = TypeVar("T")

_FIX = (
    "Give every rank the same number of batches: use loaders.ShardedDataset with remainder='pad' (pads are "
    "flagged with __pad__) or remainder='drop', or a DistributedSampler with drop_last=True."
)

# (world group object, ranks or None for the whole world, timeout in ms) -> private gloo group
_SIDE_GROUPS: dict[tuple[int, tuple[int, ...] | None, int], tuple[Any, Any]] = {}


class StepCountMismatchError(ShardpipeError, RuntimeError):
    """Ranks would run different numbers of steps; `counts[i]` is global rank `ranks[i]`'s count."""

    def __init__(self, message: str, *, ranks: list[int] | None = None, counts: list[int] | None = None):
        super().__init__(message)
        self.ranks = ranks or []
        self.counts = counts or []


class RankTimeoutError(ShardpipeError, RuntimeError):
    """Ranks did not arrive within the timeout; `missing_ranks` is None where this rank cannot know them."""

    def __init__(self, message: str, *, missing_ranks: list[int] | None = None):
        super().__init__(message)
        self.missing_ranks = missing_ranks


def _check_timeout(timeout: float) -> timedelta:
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return timedelta(seconds=timeout)


def _side_group(group: Any, timeout: float) -> tuple[Any, list[int]]:
    """A gloo group over the same ranks as `group` with our timeout, and its global ranks in group order.

    Created once per (group, timeout) and cached: creating one is itself a collective, so every rank makes
    the same creation decisions as long as they call with the same arguments.
    """
    delta = _check_timeout(timeout)
    world = dist.group.WORLD
    ranks = None if group is None else tuple(dist.get_process_group_ranks(group))
    key = (id(world), ranks, int(delta.total_seconds() * 1000))
    cached = _SIDE_GROUPS.get(key)
    if cached is not None and cached[0] is world:
        side = cached[1]
    else:
        if ranks is None:
            side = dist.new_group(backend="gloo", timeout=delta)
        else:
            # Only the members call this: a subgroup's users need not involve the rest of the world.
            side = dist.new_group(list(ranks), backend="gloo", timeout=delta, use_local_synchronization=True)
        _SIDE_GROUPS[key] = (world, side)
    return side, list(dist.get_process_group_ranks(side))


def _all_gather_ints(values: list[int], side: Any) -> list[list[int]]:
    """Every rank's `values` (same length everywhere), in group-rank order."""
    local = torch.tensor(values, dtype=torch.int64)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(side))]
    dist.all_gather(gathered, local, group=side)
    return [t.tolist() for t in gathered]


def _planned_batches(loader: Any) -> int:
    try:
        return len(loader)
    except TypeError as exc:
        raise TypeError(
            f"cannot check step counts: {type(loader).__name__} has no length (an IterableDataset without "
            "__len__?). Give the dataset a __len__ that returns this rank's exact count, or iterate it "
            "through loaders.distributed.sync.guarded(), which checks every step instead."
        ) from exc


def validate_dataloader_sync(loader: Any, timeout: float = 60.0, group: Any = None) -> int:
    """Check that every rank plans the same number of batches; return that number.

    Call it on every rank before the epoch. Without an initialized process group it returns `len(loader)`.
    """
    count = _planned_batches(loader)
    if not (dist.is_available() and dist.is_initialized()):
        return count
    side, ranks = _side_group(group, timeout)
    counts = [row[0] for row in _all_gather_ints([count], side)]
    if len(set(counts)) > 1:
        listing = ", ".join(f"rank {r}: {c} batches" for r, c in zip(ranks, counts, strict=True))
        raise StepCountMismatchError(
            f"ranks plan different numbers of batches ({listing}); the last all-reduce of the epoch would "
            f"hang on the ranks with more. {_FIX}",
            ranks=ranks,
            counts=counts,
        )
    return count


_FAILED_RANKS = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")


def epoch_barrier(timeout: float, group: Any = None, *, batches: int | None = None) -> None:
    """Wait for every rank; within `timeout` raise `RankTimeoutError` naming the ranks that did not come.

    `batches` (how many this rank took) only enriches the message. No-op without a process group.
    """
    delta = _check_timeout(timeout)
    if not (dist.is_available() and dist.is_initialized()):
        return
    side, ranks = _side_group(group, timeout)
    try:
        dist.monitored_barrier(group=side, timeout=delta, wait_all_ranks=True)
    except RuntimeError as exc:
        me = dist.get_rank()
        took = "" if batches is None else f" after {batches} batches"
        found = _FAILED_RANKS.search(str(exc))
        if found is not None:
            missing = [ranks[int(r)] for r in found.group(1).replace(" ", "").split(",") if r]
            names = ", ".join(str(r) for r in missing)
            message = (
                f"rank(s) {names} did not reach the end of the epoch within {timeout:g} s (rank {me} arrived"
                f"{took}). They are hung, crashed, slower than the timeout, or still stepping because they "
                f"have more batches than this rank. {_FIX}"
            )
        else:
            missing = None
            message = (
                f"rank {me} arrived at the end-of-epoch barrier{took} but was not released within "
                f"{timeout:g} s: some rank did not arrive; rank {ranks[0]}'s error names it. If ranks ran "
                f"different numbers of batches: {_FIX}"
            )
        raise RankTimeoutError(message, missing_ranks=missing) from exc


def guarded(
    loader: Iterable[T], timeout: float = 60.0, group: Any = None, *, check_steps: bool = True
) -> Iterator[T]:
    """Yield `loader`'s batches; raise on every rank, instead of hanging, when ranks' step counts diverge.

    See the module docstring for exactly what is caught. Without a process group it yields the batches.
    """
    _check_timeout(timeout)
    if not (dist.is_available() and dist.is_initialized()):
        yield from loader
        return
    try:
        len(loader)  # type: ignore[arg-type]
    except TypeError:
        pass
    else:
        validate_dataloader_sync(loader, timeout, group)
    side, ranks = _side_group(group, timeout)
    batches = 0
    iterator = iter(loader)
    while True:
        try:
            batch = next(iterator)
            has_batch = True
        except StopIteration:
            has_batch = False
        if check_steps:
            _agree_on_step(has_batch, batches, side, ranks, timeout)
        if not has_batch:
            break
        batches += 1
        yield batch
    epoch_barrier(timeout, group, batches=batches)


def _agree_on_step(has_batch: bool, step: int, side: Any, ranks: list[int], timeout: float) -> None:
    """Raise on every rank unless all ranks have a batch for `step`, or all have run out."""
    try:
        flags = [row[0] for row in _all_gather_ints([int(has_batch)], side)]
    except RuntimeError as exc:
        raise RankTimeoutError(
            f"rank {dist.get_rank()} waited more than {timeout:g} s for the other ranks to start batch "
            f"{step}: a rank is hung (I/O, a stuck worker), crashed, or not iterating through guarded(). "
            "Gloo does not say which; the other ranks' logs will show which one stopped."
        ) from exc
    if len(set(flags)) == 1:
        return
    done = [r for r, f in zip(ranks, flags, strict=True) if not f]
    # Ranks still going have at least one more batch; how many more nobody knows without reading them.
    counts = [step if r in done else step + 1 for r in ranks]
    listing = ", ".join(
        f"rank {r}: {c}{'' if r in done else '+'} batches" for r, c in zip(ranks, counts, strict=True)
    )
    raise StepCountMismatchError(
        f"rank(s) {', '.join(map(str, done))} ran out of batches after {step} while the others still had "
        f"more ({listing}); the next all-reduce would hang. {_FIX}",
        ranks=ranks,
        counts=counts,
    )
