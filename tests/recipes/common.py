"""What every recipe shares: its arguments, a step that uses the raw fields, and a record of each batch.

The recipes are the training scripts docs/loaders.md shows, one per trainer. Each runs on 2 CPU ranks,
stops at ``--stop-at`` steps after saving a checkpoint, or resumes from it (``--resume``) and finishes
``--epochs`` epochs. Every rank appends each batch it trains on to ``OUT/rank<r>.jsonl``, so
``tests/test_recipes.py`` can compare the stopped and resumed run, batch by batch, with an uninterrupted one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional alias

BATCH_SIZE = 4
NUM_WORKERS = 2
SEED = 0


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", help="a dataset packed by shardpipe pack")
    parser.add_argument("out", help="where the checkpoint and the records go")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument(
        "--stop-at", type=int, default=None, help="save a checkpoint after this step and stop"
    )
    parser.add_argument("--resume", action="store_true", help="resume from the checkpoint in OUT")
    parser.add_argument("--option", default=None, help="a trainer setting the test varies")
    return parser.parse_args()


def model() -> torch.nn.Module:
    torch.manual_seed(SEED)
    return torch.nn.Linear(1, 3)


def loss_of(net: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """A step over raw byte fields (as the trainers move them) with the pads kept out of the loss."""
    x = torch.tensor([[len(item) / 100.0] for item in batch["bin"]])
    y = torch.tensor([int(label) for label in batch["cls"]])
    keep = (~batch["__pad__"]).float()
    losses = F.cross_entropy(net(x), y, reduction="none")
    return (losses * keep).sum() / keep.sum().clamp(min=1)


def record(out: str, rank: int, epoch: int, batch: dict[str, Any]) -> None:
    line = {"epoch": epoch, "keys": list(batch["__key__"]), "pads": batch["__pad__"].tolist()}
    with (Path(out) / f"rank{rank}.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")
