"""Runtime loaders for datasets packed by ``shardpipe pack``: what a DDP training script imports."""

from loaders.collate import Batch, RaggedBytes, collate_samples
from loaders.dataset import ShardedDataset
from loaders.elastic import Segment, remaining_runs
from loaders.loader import ShardedLoader, make_loader
from loaders.metrics import DistributedMetrics
from loaders.monitor import EpochStats, InputMonitor
from loaders.planner import PlanConfig, Span, Window, plan_epoch, plan_windows
from loaders.sync import (
    RankTimeoutError,
    StepCountMismatchError,
    epoch_barrier,
    guarded,
    validate_dataloader_sync,
)
from loaders.transport import RingStalledError

__all__ = [
    "Batch",
    "DistributedMetrics",
    "EpochStats",
    "InputMonitor",
    "PlanConfig",
    "RaggedBytes",
    "RankTimeoutError",
    "RingStalledError",
    "Segment",
    "ShardedDataset",
    "ShardedLoader",
    "Span",
    "StepCountMismatchError",
    "Window",
    "collate_samples",
    "epoch_barrier",
    "guarded",
    "make_loader",
    "plan_epoch",
    "plan_windows",
    "remaining_runs",
    "validate_dataloader_sync",
]
