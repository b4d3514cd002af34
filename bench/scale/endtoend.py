"""End to end: a real ``Mixture`` of three small packs read through ``make_loader`` with one worker, its
``samples_per_epoch`` raised from 10^6 to 10^8: the time to the first batch (with the worker's start),
to the next epoch's first batch (the persistent worker plans it), and the worker's peak RSS."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psutil

from bench.io import data as io_data

SOURCES = (("a", 3_000), ("b", 2_000), ("c", 1_000))  # samples of 16 bytes: the plan is what grows
WORLD = 8
BATCH = 256
START_METHOD = "fork"


def prepare(cache: Path) -> list[Path]:
    """The three packs (tar), cached like every benchmark's data."""
    return [
        io_data.prepare(io_data.Profile(f"scale-{n}", size, 16), cache).packed("tar") for n, size in SOURCES
    ]


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(packs: list[str], samples: int) -> dict[str, Any]:
    """One run (the caller gives it a fresh process): the last rank of ``WORLD``, one worker."""
    from loaders import Mixture, ShardedDataset, make_loader

    sources = {name: ShardedDataset(path, rank=WORLD - 1, world_size=WORLD) for (name, _), path in
               zip(SOURCES, packs, strict=True)}  # fmt: skip
    mixture = Mixture(sources, {"a": 0.5, "b": 0.3, "c": 0.2}, samples_per_epoch=samples)
    # Forked, as a training script's workers are on Linux: this process was spawned, and a spawned
    # worker would spend its first seconds importing torch, whatever the plan.
    loader = make_loader(mixture, batch_size=BATCH, num_workers=1, multiprocessing_context=START_METHOD)
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    started = time.perf_counter()
    batches = iter(loader)
    next(batches)
    first = time.perf_counter() - started
    workers = [c.pid for c in me.children(recursive=True) if c.pid not in before]
    del batches
    loader.set_epoch(1)  # the next epoch in the same (persistent) worker: its plan, not its start
    started = time.perf_counter()
    next(iter(loader))
    again = time.perf_counter() - started
    rss = max((_peak_rss_mb(pid) for pid in workers), default=float("nan"))
    return {
        "samples": samples,
        "first_batch_s": first,
        "next_epoch_first_batch_s": again,
        "worker_peak_rss_mb": rss,
        "workers": len(workers),
        "start_method": START_METHOD,
    }
