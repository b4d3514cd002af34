"""One (rank, worker)'s windows of an epoch, in whichever layout planned it: the planner's entry points.

Layout 3 (:mod:`.stream`) computes each window when it is read; layouts 1 and 2 (:mod:`.planner`, kept
for states saved before layout 3) write a worker's part out first. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from loaders.planning.planner import (
    LAZY_LAYOUT,
    PlanConfig,
    Run,
    Runs,
    Span,
    Window,
    WindowRows,
    check_plan_args,
    epoch_runs,
    written_windows,
)
from loaders.planning.stream import Computed, RunsSequence, Samples, WindowPlan


def plan_windows(
    runs: Runs | Samples, config: PlanConfig, *, epoch: int, rank: int, worker_index: int
) -> Sequence[Window]:
    """The windows this (rank, worker) reads over the sequence ``runs`` (written out, or a function from
    position to sample), in reading order: computed one at a time when asked for in layout 3."""
    check_plan_args(config, epoch, rank, worker_index)
    if config.layout >= LAZY_LAYOUT:
        plan = _window_plan(runs, config, epoch, rank, worker_index)
        return Computed(plan.num_windows, plan.window)
    windows = written_windows(_written(runs), config, epoch=epoch, rank=rank, worker_index=worker_index)
    return [Window(list(map(Run._make, rows.tolist())), seed) for rows, seed in windows]


def window_blocks(
    runs: Runs | Samples, config: PlanConfig, *, epoch: int, rank: int, worker_index: int
) -> Sequence[WindowRows]:
    """:func:`plan_windows`'s windows as ``(rows, seed)``, rows still an array: a mixture's windows hold a
    row for nearly every sample, which it reads without a tuple each."""
    if config.layout >= LAZY_LAYOUT:
        check_plan_args(config, epoch, rank, worker_index)
        plan = _window_plan(runs, config, epoch, rank, worker_index)
        return Computed(plan.num_windows, plan.rows)
    return written_windows(_written(runs), config, epoch=epoch, rank=rank, worker_index=worker_index)


def _window_plan(runs: Runs | Samples, config: PlanConfig, epoch: int, rank: int, worker: int) -> WindowPlan:
    sequence = RunsSequence(runs) if isinstance(runs, np.ndarray) else runs
    return WindowPlan(sequence, config, epoch=epoch, rank=rank, worker_index=worker)


def plan_epoch(
    shard_sizes: Sequence[int], config: PlanConfig, *, epoch: int, rank: int, worker_index: int
) -> list[Span]:
    """Spans this (rank, worker) reads in a fresh ``epoch``, in read order (windows one after another)."""
    runs = epoch_runs(shard_sizes, config, epoch)
    windows = plan_windows(runs, config, epoch=epoch, rank=rank, worker_index=worker_index)
    return [span for window in windows for span in window.spans]


T = TypeVar("T")


def skip_whole_windows(windows: Sequence[T], skip: int, window_size: int) -> tuple[Sequence[T], int]:
    """``windows`` from the first one a resume must read, and the samples still to skip in it: every
    window but the last holds ``window_size`` samples, so the skipped ones are never computed."""
    whole = min(skip // window_size, len(windows))
    return Computed(len(windows) - whole, lambda index: windows[whole + index]), skip - whole * window_size


def _written(runs: Runs | Samples) -> Runs:
    """Layouts 1 and 2 plan over a sequence written out as runs."""
    if isinstance(runs, np.ndarray):
        return runs
    written = getattr(runs, "runs", None)
    if written is None:
        raise ValueError("layouts 1 and 2 plan over runs, not over a layout-3 sequence")
    return np.asarray(written)
