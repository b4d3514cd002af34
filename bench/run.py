"""One measured run of one contender, and the summary of its repeats.

A run builds a fresh loader, iterates ``warmup + steps`` batches through ``loaders.monitor.InputMonitor``
(copy, then compute, each batch), and keeps only the measured window: the first ``warmup`` steps are
discarded, except that the first step's wait is reported as first-batch latency (worker start included).
Repeats are summarised by their median, with min and max as the spread.
"""

from __future__ import annotations

import gc
import statistics
from dataclasses import asdict, dataclass
from typing import Any

import torch

from bench import contenders
from bench.common.system import PeakRss, evict, read_all
from bench.compute import BusyStep, GpuStep
from bench.data import Dataset
from loaders.monitor import InputMonitor

MB = 1e6  # MB/s here are decimal megabytes of sample payload (the ``bin`` field) per second


@dataclass(frozen=True, slots=True)
class Run:
    samples: int
    payload_bytes: int
    seconds: float
    wait_s: float
    copy_s: float
    compute_s: float
    steps: int
    first_batch_s: float
    peak_rss: int
    peak_gpu: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds

    @property
    def wait_fraction(self) -> float:
        return self.wait_s / self.seconds


def payload_of(batch: Any) -> int:
    return int(batch["bin"].nbytes)


def run_once(
    name: str,
    data: Dataset,
    settings: contenders.LoaderSettings,
    step: BusyStep | GpuStep,
    *,
    warmup: int,
    steps: int,
    cold: bool,
) -> Run:
    """Build ``name``'s loader and time ``warmup + steps`` batches of copy + compute."""
    if cold:
        evict(contenders.files_read(name, data))
    else:  # warm means warm: files another run evicted (or never read since written) are read in first
        read_all(contenders.files_read(name, data))
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    with PeakRss() as rss:
        loader = contenders.build(name, data, settings)
        monitor = InputMonitor(loader, warmup_steps=warmup, count_bytes=payload_of)
        batches = iter(monitor)  # a generator: close() ends the last step
        for index, batch in enumerate(batches):
            step(batch, monitor)
            if index + 1 >= warmup + steps:
                break
        batches.close()  # ends the last step now, and lets the loader's workers go
        stats = monitor.end_epoch()
        phases = monitor.phase_totals()
        del batches, loader, monitor
        gc.collect()
    if stats.steps < steps:
        raise RuntimeError(
            f"{name}: the loader ran out after {stats.steps + warmup} batches, expected {warmup + steps}; "
            f"use fewer --steps or a larger profile"
        )
    return Run(
        samples=stats.samples,
        payload_bytes=stats.num_bytes,
        seconds=stats.wall_s,
        wait_s=stats.wait_s,
        copy_s=phases.get("copy", 0.0),
        compute_s=phases.get("compute", 0.0),
        steps=stats.steps,
        first_batch_s=stats.first_batch_s,
        peak_rss=rss.peak,
        peak_gpu=stats.peak_gpu,
    )


def summarize(name: str, runs: list[Run], threshold: float) -> dict[str, Any]:
    """One report entry: medians over repeats, min/max spread; MB/s = samples/s x mean payload/sample."""
    sps = [r.samples_per_s for r in runs]
    bytes_per_sample = sum(r.payload_bytes for r in runs) / sum(r.samples for r in runs)
    wait = statistics.median(r.wait_fraction for r in runs)
    steps = sum(r.steps for r in runs)
    return {
        "contender": name,
        "samples_per_s": statistics.median(sps),
        "samples_per_s_min": min(sps),
        "samples_per_s_max": max(sps),
        "bytes_per_sample": bytes_per_sample,
        "mb_per_s": statistics.median(sps) * bytes_per_sample / MB,
        "mb_per_s_min": min(sps) * bytes_per_sample / MB,
        "mb_per_s_max": max(sps) * bytes_per_sample / MB,
        "wait_fraction": wait,
        "verdict": "input-bound" if wait > threshold else "compute-bound",
        "wait_ms_per_step": 1000 * sum(r.wait_s for r in runs) / steps,
        "copy_ms_per_step": 1000 * sum(r.copy_s for r in runs) / steps,
        "compute_ms_per_step": 1000 * sum(r.compute_s for r in runs) / steps,
        "first_batch_s": statistics.median(r.first_batch_s for r in runs),
        "peak_rss_mb": max(r.peak_rss for r in runs) / MB,
        "peak_gpu_mb": max(r.peak_gpu for r in runs) / MB if torch.cuda.is_available() else None,
        "runs": [{**asdict(r), "samples_per_s": r.samples_per_s} for r in runs],
    }
