"""The epoch planner, public and pure: which samples each (rank, worker) reads, as a function of (shard
sizes, world, seed, epoch) alone, with no I/O, so a plan can be checked or reasoned about without a file.

:func:`plan_epoch` gives the spans (:class:`Span`) one (rank, worker) reads in a fresh epoch under a
:class:`PlanConfig`; :func:`plan_windows` its windows (:class:`Window`: spans read together, then
permuted), each computed when asked for; :func:`epoch_samples` the sequence a pass plans over, less what
the saved segments (:class:`Segment`) of an elastic resume consumed (:func:`rest_of` for any sequence;
:func:`remaining_runs` and :func:`remaining_of` write it out for states of layouts 1 and 2). A mixture of
datasets plans its epoch's sequence with :func:`epoch_mix` (exact counts, :class:`EpochMix`,
:class:`Stages` for weights that change within an epoch) and :class:`MixtureSequence` (which source and
sample fills each position, by range; :func:`epoch_sequence` writes it out for the older layouts), and
locates its sources' samples with :class:`SourceTable`. The rules are in the docstrings of :mod:`.planner`,
:mod:`.stream` and :mod:`.mixture`.

Inside: :mod:`.plan` (the entry points, every layout), :mod:`.planner` (the rules, and layouts 1 and 2
written out), :mod:`.stream` (layout 3: a window at a time), :mod:`.permutation` (seeded bijections
computed per index), :mod:`.elastic` (resuming on another world), :mod:`.mixing` (defaults by pack
order), :mod:`.weights`, :mod:`.mixture`, :mod:`.schedule` and :mod:`.balance` (a mixture's counts,
sequence by range and per-batch composition), :mod:`.position` (where a run stands, shared with workers;
not pure, not exported).
"""

from loaders.planning.elastic import Segment, epoch_samples, remaining_of, remaining_runs, rest_of
from loaders.planning.mixture import MixtureSequence, SourceTable, cursor_runs, epoch_schedule, epoch_sequence
from loaders.planning.plan import plan_epoch, plan_windows
from loaders.planning.planner import PlanConfig, Span, Window
from loaders.planning.weights import EpochMix, Stage, Stages, epoch_mix, largest_remainder

__all__ = [
    "EpochMix",
    "MixtureSequence",
    "PlanConfig",
    "Segment",
    "SourceTable",
    "Span",
    "Stage",
    "Stages",
    "Window",
    "cursor_runs",
    "epoch_mix",
    "epoch_samples",
    "epoch_schedule",
    "epoch_sequence",
    "largest_remainder",
    "plan_epoch",
    "plan_windows",
    "remaining_of",
    "remaining_runs",
    "rest_of",
]
