"""One rank of one weak-scaling launch (started by torchrun from ``bench.scaling``; not run by hand).

Every rank trains the same DDP MLP with the same per-rank batch size, on its own share of the packed tar
data (``ShardedDataset`` + ``make_loader``) or on in-memory batches (``--synthetic``). Each step is timed
in parts through ``InputMonitor``: data wait (blocked in ``next()``), prepare (bytes to tensors), forward,
backward (until the last gradient bucket is ready), allreduce (the rest of ``backward()``), optimizer. On
CUDA every part ends with a synchronize, so the parts are device time, not launch time. After the warm-up,
``repeats`` consecutive windows of ``steps`` steps are kept; rank 0 gathers every rank's steps into JSON.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bench.scaling.model import CommTimer, build_mlp, synthetic_batches, timed_allreduce_hook, to_inputs
from loaders import ShardedDataset, make_loader
from loaders.distributed.sync import validate_dataloader_sync
from loaders.monitor import InputMonitor

PARTS = ("prepare", "forward", "backward", "allreduce", "optimizer")


def batches(cfg: dict[str, Any], rank: int, total: int) -> Iterable[Any]:
    """``total`` batches for this rank: from the packed data, or cycled in-memory ones."""
    if cfg["synthetic"]:
        return itertools.islice(itertools.cycle(synthetic_batches(cfg["batch_size"], seed=rank)), total)
    dataset = ShardedDataset(cfg["data"], "train", decode={"cls": "cls"}, shuffle=True, seed=0)
    loader = make_loader(dataset, batch_size=cfg["batch_size"], num_workers=cfg["workers"])
    planned = validate_dataloader_sync(loader)  # every rank runs the same number of steps, or we stop here
    if planned < total:
        raise RuntimeError(
            f"{len(dataset)} samples per rank give {planned} batches, the run needs {total}: "
            "use fewer --steps/--repeats or a larger --samples"
        )
    return loader


def make_step(
    model: nn.Module, timer: CommTimer, device: torch.device
) -> Callable[[Any, InputMonitor[Any]], None]:
    """One timed training step; its parts go into the monitor's current step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    cuda = device.type == "cuda"

    def now() -> float:
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def step(batch: Any, monitor: InputMonitor[Any]) -> None:
        t0 = now()
        if "x" in batch:  # synthetic
            x = batch["x"].to(device, non_blocking=True).float().div_(255)
            y = batch["y"].to(device, non_blocking=True)
        else:
            x, y = to_inputs(batch, device)
        t1 = now()
        loss = nn.functional.cross_entropy(model(x), y)
        t2 = now()
        timer.reset()
        loss.backward()
        t3 = now()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t4 = now()
        ready = min(max(timer.last_ready() or t3, t2), t3)
        for name, seconds in zip(PARTS, (t1 - t0, t2 - t1, ready - t2, t3 - ready, t4 - t3), strict=True):
            monitor.add(name, seconds)
        monitor.add("allreduce_in_flight", timer.in_flight())

    return step


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """Warm-up, then ``repeats`` windows of ``steps`` steps; returns this rank's measured steps."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cfg["cuda"] else torch.device("cpu")
    )
    torch.manual_seed(0)  # DDP broadcasts rank 0's weights; the seed makes them the same in every launch
    model = build_mlp(cfg["hidden"], cfg["layers"]).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cfg["cuda"] else None)
    timer = CommTimer()
    ddp.register_comm_hook(timer, timed_allreduce_hook)
    step = make_step(ddp, timer, device)
    warmup, steps, repeats = cfg["warmup"], cfg["steps"], cfg["repeats"]
    total = warmup + steps * repeats
    monitor = InputMonitor(batches(cfg, rank, total), warmup_steps=warmup)
    iterator = iter(monitor)
    for index, batch in enumerate(iterator):
        step(batch, monitor)
        if index + 1 >= total:
            break
    iterator.close()  # ends the last step's clock
    measured = monitor.steps[warmup:]
    if len(measured) != steps * repeats:
        raise RuntimeError(f"rank {rank}: {len(measured)} measured steps, expected {steps * repeats}")
    rows = [
        {"repeat": i // steps, "samples": s.samples, "step": s.step_s, "data_wait": s.wait_s, **s.phases}
        for i, s in enumerate(measured)
    ]
    return {"rank": rank, "world": world, "device": str(device), "steps": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="JSON written by bench.scaling")
    cfg = json.loads(parser.parse_args(argv).config.read_text())
    torch.set_num_threads(cfg["threads"])
    if cfg["cuda"]:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cfg["cuda"] else "gloo")
    try:
        mine = run(cfg)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        if dist.get_rank() == 0:
            Path(cfg["result"]).write_text(json.dumps({"backend": dist.get_backend(), "ranks": gathered}))
    finally:
        gc.collect()  # DDP's reducer sits in reference cycles: free it while its process group still exists
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: gloo's worker threads can still be running when C++ statics are destroyed,
    # and about 1 launch in 6 (torch 2.13, 2 ranks) then aborted with "terminate called without an active
    # exception" after the rank had finished its work and written its results.
    os._exit(status)
