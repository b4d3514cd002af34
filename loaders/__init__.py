"""Runtime loaders for datasets packed by ``shardpipe pack``: what a DDP training script imports."""

from loaders.collate import RaggedBytes, collate_samples
from loaders.dataset import ShardedDataset
from loaders.loader import ShardedLoader, make_loader
from loaders.planner import PlanConfig, Span, plan_epoch

__all__ = [
    "PlanConfig",
    "RaggedBytes",
    "ShardedDataset",
    "ShardedLoader",
    "Span",
    "collate_samples",
    "make_loader",
    "plan_epoch",
]
