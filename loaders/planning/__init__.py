"""The epoch planner, public and pure: which samples each (rank, worker) reads, as a function of (shard
sizes, world, seed, epoch) alone, with no I/O, so a plan can be checked or reasoned about without a file.

:func:`plan_epoch` gives the spans (:class:`Span`) one (rank, worker) reads in a fresh epoch under a
:class:`PlanConfig`; :func:`plan_windows` its windows (:class:`Window`: spans read together, then
permuted); :func:`remaining_runs` what is left of an epoch after the saved segments (:class:`Segment`) of
an elastic resume. A mixture of datasets plans its epoch's sequence with :func:`epoch_mix` (exact
counts, :class:`EpochMix`, :class:`Stages` for weights that change within an epoch) and
:func:`epoch_sequence` (which source and sample fills each position). The rules are in the docstrings of
:mod:`.planner` and :mod:`.mixture`.

Inside: :mod:`.planner` (the plan), :mod:`.elastic` (resuming on another world), :mod:`.mixing` (defaults
by pack order), :mod:`.weights`, :mod:`.mixture` and :mod:`.balance` (a mixture's counts, sequence and
per-batch composition), :mod:`.position` (where a run stands, shared with workers; not pure, not exported).
"""

from loaders.planning.elastic import Segment, remaining_of, remaining_runs
from loaders.planning.mixture import cursor_runs, epoch_schedule, epoch_sequence
from loaders.planning.plan import plan_epoch, plan_windows
from loaders.planning.planner import PlanConfig, Span, Window
from loaders.planning.weights import EpochMix, Stage, Stages, epoch_mix, largest_remainder

__all__ = [
    "EpochMix",
    "PlanConfig",
    "Segment",
    "Span",
    "Stage",
    "Stages",
    "Window",
    "cursor_runs",
    "epoch_mix",
    "epoch_schedule",
    "epoch_sequence",
    "largest_remainder",
    "plan_epoch",
    "plan_windows",
    "remaining_of",
    "remaining_runs",
]
