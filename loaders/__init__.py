"""Runtime loaders for datasets packed by ``shardpipe pack``: what a DDP training script imports.

``__all__`` is the dataset, its map-style twin for random access, the mixture of datasets, the loader,
remote reading, the image crops, the sync tools and their errors, exact metrics and the input monitor. The
rest has its own public home:
:mod:`loaders.planning` (the pure planner), :mod:`loaders.decoding` (decoders of your own),
:mod:`loaders.batches` (what a batch is made of), :mod:`loaders.monitor` (``EpochStats``). Their old
names here still import, with a ``DeprecationWarning`` naming the new place, for one release.

Inside: :mod:`.planned` (what every dataset read by plan shares: epochs, equal steps, saved state),
:mod:`.dataset` (``ShardedDataset``, rank- and worker-aware), with :mod:`.options` (how a split is read)
and :mod:`.skips` (samples skipped as unreadable, counted across workers), :mod:`.random_access`
(``ShardedMapDataset``: any sample by position or key), :mod:`.mixture` (``Mixture``: several sources read
as one, at exact proportions) and :mod:`.mixture_sources` (the checks that they can be), :mod:`.loader`
(``make_loader``), :mod:`.reading` (reading a plan's samples), :mod:`.images` (images decoded and cropped
into batches), :mod:`.cache` (the per-node cache of remote shards), :mod:`.transfer` (batches handed from
workers to the trainer cheaply) and :mod:`.distributed` (keeping distributed training honest).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from loaders.dataset import ShardedDataset
from loaders.distributed.metrics import DistributedMetrics
from loaders.distributed.sync import (
    RankTimeoutError,
    StepCountMismatchError,
    epoch_barrier,
    guarded,
    validate_dataloader_sync,
)
from loaders.images.crops import CenterCrop, RandomResizedCrop
from loaders.loader import ShardedLoader, make_loader
from loaders.mixture import Mixture
from loaders.monitor import InputMonitor
from loaders.random_access import ShardedMapDataset
from loaders.reading.source import RemoteOptions

__all__ = [
    "CenterCrop",
    "DistributedMetrics",
    "InputMonitor",
    "Mixture",
    "RandomResizedCrop",
    "RankTimeoutError",
    "RemoteOptions",
    "ShardedDataset",
    "ShardedLoader",
    "ShardedMapDataset",
    "StepCountMismatchError",
    "epoch_barrier",
    "guarded",
    "make_loader",
    "validate_dataloader_sync",
]

DEPRECATED: dict[str, str] = {
    **dict.fromkeys(
        ["PlanConfig", "Segment", "Span", "Window", "plan_epoch", "plan_windows", "remaining_runs"],
        "loaders.planning",
    ),
    **dict.fromkeys(["ColumnDecoder", "DecodeContext", "column_decoder"], "loaders.decoding"),
    **dict.fromkeys(["Batch", "RaggedBytes", "RingStalledError", "collate_samples"], "loaders.batches"),
    "EpochStats": "loaders.monitor",
}
"""Names this package exported before the public API was narrowed, and the module that now holds each."""


def __getattr__(name: str) -> Any:
    """Resolve a deprecated name from its new home, warning where it was used (PEP 562)."""
    home = DEPRECATED.get(name)
    if home is None:
        raise AttributeError(f"module 'loaders' has no attribute {name!r}")
    warnings.warn(
        f"loaders.{name} is deprecated and goes in the next release: import it from {home} ({home}.{name})",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)
