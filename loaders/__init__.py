"""Runtime loaders for datasets packed by ``shardpipe pack``: what a DDP training script imports."""

from loaders.dataset import ShardedDataset
from loaders.distributed.metrics import DistributedMetrics
from loaders.distributed.sync import (
    RankTimeoutError,
    StepCountMismatchError,
    epoch_barrier,
    guarded,
    validate_dataloader_sync,
)
from loaders.loader import ShardedLoader, make_loader
from loaders.monitor import EpochStats, InputMonitor
from loaders.planning.elastic import Segment, remaining_runs
from loaders.planning.planner import PlanConfig, Span, Window, plan_epoch, plan_windows
from loaders.reading.decode import ColumnDecoder, DecodeContext, column_decoder
from loaders.reading.images import CenterCrop, RandomResizedCrop
from loaders.reading.source import RemoteOptions
from loaders.transfer.collate import Batch, RaggedBytes, collate_samples
from loaders.transfer.transport import RingStalledError

__all__ = [
    "Batch",
    "CenterCrop",
    "ColumnDecoder",
    "DecodeContext",
    "DistributedMetrics",
    "EpochStats",
    "InputMonitor",
    "PlanConfig",
    "RaggedBytes",
    "RandomResizedCrop",
    "RankTimeoutError",
    "RemoteOptions",
    "RingStalledError",
    "Segment",
    "ShardedDataset",
    "ShardedLoader",
    "Span",
    "StepCountMismatchError",
    "Window",
    "collate_samples",
    "column_decoder",
    "epoch_barrier",
    "guarded",
    "make_loader",
    "plan_epoch",
    "plan_windows",
    "remaining_runs",
    "validate_dataloader_sync",
]
