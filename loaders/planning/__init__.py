"""The epoch planner, public and pure: which samples each (rank, worker) reads, as a function of (shard
sizes, world, seed, epoch) alone, with no I/O, so a plan can be checked or reasoned about without a file.

:func:`plan_epoch` gives the spans (:class:`Span`) one (rank, worker) reads in a fresh epoch under a
:class:`PlanConfig`; :func:`plan_windows` its windows (:class:`Window`: spans read together, then
permuted); :func:`remaining_runs` what is left of an epoch after the saved segments (:class:`Segment`) of
an elastic resume. The rules are in the docstring of :mod:`.planner`.

Inside: :mod:`.planner` (the plan), :mod:`.elastic` (resuming on another world), :mod:`.mixing` (defaults
by pack order), :mod:`.position` (where a run stands, shared with workers; not pure, not exported).
"""

from loaders.planning.elastic import Segment, remaining_runs
from loaders.planning.planner import PlanConfig, Span, Window, plan_epoch, plan_windows

__all__ = ["PlanConfig", "Segment", "Span", "Window", "plan_epoch", "plan_windows", "remaining_runs"]
