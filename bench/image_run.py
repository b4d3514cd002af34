"""One measured run of one image contender, and the summary of its repeats.

As ``bench.run``, with what images need besides: a run cycles epochs (``set_epoch`` between passes, the
workers kept), so a window may be longer than one epoch of a small photo set, and the epoch boundaries'
stalls count as a training run's do; and each run records the CPU seconds its measured window cost, the
main process and its live children (the DataLoader workers) together, sampled at the window's first and
last step: per image, what the input pipeline costs whatever the cores. ``decode-limit`` runs the crop
alone (:mod:`bench.image_limit`): no wait, no first batch, CPU of its own processes.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from bench import image_limit
from bench.common.system import PeakRss
from bench.compute import BusyStep, ImageGpuStep
from bench.contenders import LoaderSettings
from bench.image_contenders import ImageSource, build_image, is_limit, set_epoch
from loaders import RaggedBytes
from loaders.monitor import InputMonitor

MB = 1e6


@dataclass(frozen=True, slots=True)
class ImageRun:
    samples: int
    seconds: float
    wait_s: float
    copy_s: float
    compute_s: float
    steps: int
    first_batch_s: float
    cpu_s: float
    peak_rss: int

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds

    @property
    def wait_fraction(self) -> float:
        return self.wait_s / self.seconds

    @property
    def cpu_ms_per_sample(self) -> float:
        return 1000 * self.cpu_s / self.samples


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its live children so far."""
    me = psutil.Process()
    times = me.cpu_times()
    total = float(times.user + times.system)
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a child may exit meanwhile
            times = child.cpu_times()
            total += times.user + times.system
    return total


def epochs(loader: Any) -> Iterator[Any]:
    """The loader's batches, pass after pass, reseeded per pass."""
    epoch = 0
    while True:
        set_epoch(loader, epoch)
        yield from loader
        epoch += 1


def run_image_once(
    name: str,
    source: ImageSource,
    settings: LoaderSettings,
    step: BusyStep | ImageGpuStep,
    *,
    warmup: int,
    steps: int,
    limit_columns: list[tuple[RaggedBytes, list[str]]] | None = None,
) -> ImageRun:
    """Time ``warmup + steps`` batches of contender ``name`` (copy + compute each), or the decode limit
    over the same number of samples."""
    if is_limit(name):
        if limit_columns is None:
            raise ValueError(f"{name} needs the photos as columns (limit_columns)")
        with PeakRss() as rss:
            limit = image_limit.decode_limit(limit_columns, settings.num_workers, steps * settings.batch_size)
        return ImageRun(limit.samples, limit.samples / limit.samples_per_s, 0.0, 0.0, 0.0,
                        -(-limit.samples // settings.batch_size), 0.0, limit.cpu_s, rss.peak)  # fmt: skip
    with PeakRss() as rss:
        loader = build_image(name, source, settings)
        monitor = InputMonitor(
            epochs(loader), warmup_steps=warmup, count=lambda batch: len(batch[source.field])
        )
        batches = iter(monitor)
        cpu_start = cpu_seconds() if warmup == 0 else 0.0
        cpu_end = 0.0
        for index, batch in enumerate(batches):
            step(batch, monitor)
            if index + 1 == warmup:  # the measured window starts with the next step
                cpu_start = cpu_seconds()
            if index + 1 >= warmup + steps:
                cpu_end = cpu_seconds()  # before close(): the workers are still alive to be counted
                break
        batches.close()
        stats = monitor.end_epoch()
        phases = monitor.phase_totals()
        del batches, loader, monitor
        gc.collect()
    return ImageRun(
        samples=stats.samples,
        seconds=stats.wall_s,
        wait_s=stats.wait_s,
        copy_s=phases.get("copy", 0.0),
        compute_s=phases.get("compute", 0.0),
        steps=stats.steps,
        first_batch_s=stats.first_batch_s,
        cpu_s=cpu_end - cpu_start,
        peak_rss=rss.peak,
    )


def summarize_image(name: str, runs: list[ImageRun], threshold: float) -> dict[str, Any]:
    """One report entry: medians over repeats, min/max spread, CPU per image over all repeats."""
    sps = [r.samples_per_s for r in runs]
    wait = statistics.median(r.wait_fraction for r in runs)
    steps = sum(r.steps for r in runs)
    return {
        "contender": name,
        "samples_per_s": statistics.median(sps),
        "samples_per_s_min": min(sps),
        "samples_per_s_max": max(sps),
        "cpu_ms_per_sample": 1000 * sum(r.cpu_s for r in runs) / sum(r.samples for r in runs),
        "wait_fraction": wait,
        "verdict": "-" if is_limit(name) else "input-bound" if wait > threshold else "compute-bound",
        "wait_ms_per_step": 1000 * sum(r.wait_s for r in runs) / steps,
        "copy_ms_per_step": 1000 * sum(r.copy_s for r in runs) / steps,
        "compute_ms_per_step": 1000 * sum(r.compute_s for r in runs) / steps,
        "first_batch_s": statistics.median(r.first_batch_s for r in runs),
        "peak_rss_mb": max(r.peak_rss for r in runs) / MB,
        "runs": [{**asdict(r), "samples_per_s": r.samples_per_s} for r in runs],
    }
