"""DDP training of a small MLP on the packed handwritten digits: the loaders used as a real script would.

Launch with torchrun (gloo on CPU), one process per rank::

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m bench.demo.train \\
        --data demo-out/packed-tar --epochs 10

Why each piece is here: ``validate_dataloader_sync`` proves before the first step that every rank plans
the same number of batches (else the last all-reduce would hang); ``set_epoch`` reseeds the shuffle each
epoch; pads (``__pad__``) are masked out of the training loss and out of ``DistributedMetrics``, so the
reported numbers are exact over the real samples of the split whatever the padding; ``InputMonitor`` times
how long each step waits for its batch. Rank 0 prints per epoch (numbered from 0, as ``set_epoch`` takes it)
a metrics line and the monitor's line; at the end every rank states its step count, and rank 0 prints a
``FINAL`` line. Every rank exits 1 when val accuracy <= ``--min-accuracy``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 - the conventional alias
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from loaders import ShardedDataset, make_loader
from loaders.distributed.metrics import DistributedMetrics
from loaders.distributed.sync import validate_dataloader_sync
from loaders.monitor import InputMonitor

NUM_PIXELS = 64  # 8 x 8 grayscale


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="dataset folder written by `shardpipe pack`")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-accuracy", type=float, default=0.9, help="exit 1 unless val accuracy > this")
    return parser.parse_args(argv)


def build_model(hidden: int, num_classes: int) -> nn.Module:
    """An MLP is enough for 8x8 digits (~97% val) and keeps each step cheap on 2 CPU cores."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(NUM_PIXELS, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
    )


def to_inputs(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch dict -> (pixels in 0..1, labels, pad mask). PNGs decode to uint8 (B, 1, 8, 8)."""
    images = batch["png"].to(torch.float32) / 255.0
    return images, batch["cls"].to(torch.int64), batch["__pad__"].to(torch.bool)


def train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[Any],
    metrics: DistributedMetrics,
) -> int:
    """One pass; the loss leaves pads out (an all-pad batch still steps, with a zero gradient)."""
    model.train()
    steps = 0
    for batch in batches:
        images, labels, pad = to_inputs(batch)
        logits = model(images)
        losses = F.cross_entropy(logits, labels, reduction="none")
        keep = (~pad).to(losses.dtype)
        loss = (losses * keep).sum() / keep.sum().clamp(min=1.0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        metrics.update(logits, labels, loss=losses, pad_mask=pad)
        steps += 1
    return steps


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[Any], metrics: DistributedMetrics) -> int:
    """Accumulate val metrics locally; the caller's ``compute()`` reduces them once across ranks."""
    model.eval()
    steps = 0
    for batch in batches:
        images, labels, pad = to_inputs(batch)
        logits = model(images)
        metrics.update(logits, labels, loss=F.cross_entropy(logits, labels, reduction="none"), pad_mask=pad)
        steps += 1
    return steps


def gather_ints(values: list[int]) -> list[list[int]]:
    """Every rank's ``values`` (one small all-gather): lets rank 0 print and check per-rank step counts."""
    local = torch.tensor(values, dtype=torch.int64)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return [t.tolist() for t in gathered]


def fmt(value: float | int | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # 2 ranks + their workers share a few cores: avoid oversubscription
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        torch.manual_seed(args.seed)  # DDP broadcasts rank 0's weights anyway; this makes them repeatable
        decode = {"png": "png", "cls": "cls"}
        train_set = ShardedDataset(args.data, "train", decode=decode, shuffle=True, seed=args.seed)
        val_set = ShardedDataset(args.data, "val", decode=decode, shuffle=False, remainder="pad")
        train_loader = make_loader(train_set, batch_size=args.batch_size, num_workers=args.workers)
        val_loader = make_loader(val_set, batch_size=args.batch_size, num_workers=args.workers)
        num_classes = len(train_set.manifest.classes or range(10))
        planned = validate_dataloader_sync(train_loader)
        validate_dataloader_sync(val_loader)

        model = DistributedDataParallel(build_model(args.hidden, num_classes))
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        train_metrics = DistributedMetrics(num_classes)
        val_metrics = DistributedMetrics(num_classes)
        if rank == 0:
            print(
                f"world {world}, train {len(train_set)} samples/rank ({planned} batches of "
                f"{args.batch_size}), val {len(val_set)} samples/rank, {args.workers} workers/rank",
                flush=True,
            )

        # Times each step's wait for its batch: tells an input-bound run from a compute-bound one. One pass
        # over the monitor is one epoch; the first step (worker start-up) is left out of its numbers.
        monitor = InputMonitor(train_loader, warmup_steps=1)
        steps_per_epoch: list[int] = []
        val = {}
        start = time.perf_counter()
        for epoch in range(args.epochs):
            t0 = time.perf_counter()
            train_loader.set_epoch(epoch)
            val_loader.set_epoch(epoch)  # no reshuffle (shuffle=False), but says "a new pass" explicitly
            train_metrics.reset()
            val_metrics.reset()
            steps_per_epoch.append(train_epoch(model, optimizer, monitor, train_metrics))
            evaluate(model, val_loader, val_metrics)
            train, val = train_metrics.compute(), val_metrics.compute()
            wait_line = monitor.summary_line()  # a collective: every rank calls it
            if rank == 0:
                print(
                    f"epoch {epoch} ({epoch + 1}/{args.epochs})  train_loss {fmt(train['loss'])}  "
                    f"val_loss {fmt(val['loss'])}  val_acc {fmt(val['accuracy'])}  "
                    f"val_macro_f1 {fmt(val['macro_f1'])}  val_samples {val['samples']}  "
                    f"({time.perf_counter() - t0:.1f} s)",
                    flush=True,
                )
                print(f"  input: {wait_line}", flush=True)

        # Each rank states its own count (checked by tests/test_demo.py), then rank 0 prints them all.
        sys.stdout.write(f"rank {rank} train_steps {sum(steps_per_epoch)} planned {planned * args.epochs}\n")
        sys.stdout.flush()
        per_rank = gather_ints(steps_per_epoch)
        accuracy = val.get("accuracy") or 0.0
        ok = accuracy > args.min_accuracy
        if rank == 0:
            totals = " ".join(f"rank{r}={sum(s)}" for r, s in enumerate(per_rank))
            print(f"steps per rank: {totals} (per epoch: {per_rank[0]})", flush=True)
            same = all(s == per_rank[0] for s in per_rank)
            print(
                f"FINAL val_accuracy={accuracy:.4f} val_macro_f1={fmt(val.get('macro_f1'))} "
                f"val_loss={fmt(val.get('loss'))} epochs={args.epochs} world={world} "
                f"equal_steps={same} train_time={time.perf_counter() - start:.1f}s "
                f"{'PASS' if ok else f'FAIL (needs > {args.min_accuracy})'}",
                flush=True,
            )
        return 0 if ok else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
