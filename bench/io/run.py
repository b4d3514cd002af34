"""One measured run of one contender, the rounds that interleave a group's runs, and their summary.

A run builds a fresh loader, iterates ``warmup + steps`` batches through ``loaders.monitor.InputMonitor``
(copy, then compute, each batch), and keeps only the measured window: the first ``warmup`` steps are
discarded, except that the first step's wait is reported as first-batch latency (worker start included).
An image run (``cycle``) goes further: it cycles epochs (``set_epoch`` between passes, the workers kept), so
a window may be longer than one epoch of a small photo set and the epoch boundaries' stalls count as a
training run's do; and it records the CPU seconds of its measured window, the main process and its live
children (the DataLoader workers) together, sampled at the window's first and last step: per image, what
the input pipeline costs whatever the cores.

Every contender of a group runs once per round, the order rotated each round (:func:`rounds`), so drift
on a noisy machine hits all alike, and round ``r`` of two contenders ran back to back (which
``bench.io.targets`` pairs). Repeats are summarised by their median, with min and max as the spread.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import psutil
import torch
from torch.utils.data import DistributedSampler

from bench.common.system import PeakRss, evict, read_all
from bench.io import contenders
from bench.io.compute import Step
from bench.io.data import Dataset
from loaders.monitor import InputMonitor, count_samples

MB = 1e6  # MB/s here are decimal megabytes of sample payload (the ``bin`` field) per second


@dataclass(frozen=True, slots=True)
class Run:
    samples: int
    seconds: float
    wait_s: float
    copy_s: float
    compute_s: float
    steps: int
    first_batch_s: float
    peak_rss: int
    peak_gpu: float | None = None  # torch.cuda.max_memory_allocated over the run (None: not a loader's)
    payload_bytes: int | None = None  # the byte profiles: the ``bin`` field's bytes in the window
    cpu_s: float | None = None  # the image profiles: CPU seconds of the window, workers included

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds

    @property
    def wait_fraction(self) -> float:
        return self.wait_s / self.seconds

    def record(self) -> dict[str, Any]:
        """The run as ``report.json`` keeps it: what this kind of run measured, and its samples/s."""
        kept = {k: v for k, v in asdict(self).items() if v is not None}
        return {**kept, "samples_per_s": self.samples_per_s}


def rounds(
    names: list[str], repeats: int, one: Callable[[str], Run], show: Callable[[int, str, Run], None]
) -> dict[str, list[Run]]:
    """``repeats`` rounds of ``one(name)`` over every name, the order rotated each round; ``show(round,
    name, run)`` after each. The runs by name, in round order."""
    runs: dict[str, list[Run]] = {n: [] for n in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            run = one(name)
            runs[name].append(run)
            show(repeat, name, run)
    return runs


def payload_of(batch: Any) -> int:
    payload = batch["bin"]  # RaggedBytes, or the list of bytes a hand-written loop collates
    return sum(map(len, payload)) if isinstance(payload, list) else int(payload.nbytes)


def run_once(
    name: str,
    data: Dataset,
    settings: contenders.LoaderSettings,
    step: Step,
    *,
    warmup: int,
    steps: int,
    cold: bool,
) -> Run:
    """Build byte contender ``name``'s loader and time ``warmup + steps`` batches of copy + compute."""
    if cold:
        evict(contenders.files_read(name, data))
    else:  # warm means warm: files another run evicted (or never read since written) are read in first
        read_all(contenders.files_read(name, data))
    run = timed(
        lambda: contenders.build(name, data, settings),
        step,
        warmup=warmup,
        steps=steps,
        count_bytes=payload_of,
    )
    if run.steps < steps:
        raise RuntimeError(
            f"{name}: the loader ran out after {run.steps + warmup} batches, expected {warmup + steps}; "
            f"use fewer --steps or a larger profile"
        )
    return run


def timed(
    build: Callable[[], Iterable[Any]],
    step: Step,
    *,
    warmup: int,
    steps: int,
    count: Callable[[Any], int] = count_samples,
    count_bytes: Callable[[Any], int] | None = None,
    cycle: bool = False,
) -> Run:
    """Time ``warmup + steps`` batches of the loader ``build()`` makes; ``cycle``: pass after pass, and the
    window's CPU seconds recorded."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    with PeakRss() as rss:
        loader = build()
        source = epochs(loader) if cycle else loader
        monitor = InputMonitor(source, warmup_steps=warmup, count=count, count_bytes=count_bytes)
        batches = iter(monitor)  # a generator: close() ends the last step
        cpu_start = cpu_seconds() if cycle and warmup == 0 else 0.0
        cpu_end = 0.0
        for index, batch in enumerate(batches):
            step(batch, monitor)
            if cycle and index + 1 == warmup:  # the measured window starts with the next step
                cpu_start = cpu_seconds()
            if index + 1 >= warmup + steps:
                if cycle:  # before close(): the workers are still alive to be counted
                    cpu_end = cpu_seconds()
                break
        batches.close()  # ends the last step now, and lets the loader's workers go
        stats = monitor.end_epoch()
        phases = monitor.phase_totals()
        del batches, source, loader, monitor
        gc.collect()
    return Run(
        samples=stats.samples,
        seconds=stats.wall_s,
        wait_s=stats.wait_s,
        copy_s=phases.get("copy", 0.0),
        compute_s=phases.get("compute", 0.0),
        steps=stats.steps,
        first_batch_s=stats.first_batch_s,
        peak_rss=rss.peak,
        peak_gpu=stats.peak_gpu,
        payload_bytes=None if count_bytes is None else stats.num_bytes,
        cpu_s=cpu_end - cpu_start if cycle else None,
    )


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


def set_epoch(loader: Any, epoch: int) -> None:
    """Reseed the next pass where the loader has a way to (shardpipe's loader, a DistributedSampler)."""
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    elif isinstance(getattr(loader, "sampler", None), DistributedSampler):
        loader.sampler.set_epoch(epoch)


def summarize(name: str, runs: list[Run], threshold: float, *, judged: bool = True) -> dict[str, Any]:
    """One report entry: medians over repeats, min/max spread; for the byte profiles MB/s (samples/s x
    mean payload per sample), for the image profiles CPU ms per image over all repeats. ``judged=False``
    (a decode limit, which waits for nothing): no verdict."""
    sps = [r.samples_per_s for r in runs]
    wait = statistics.median(r.wait_fraction for r in runs)
    steps, samples = sum(r.steps for r in runs), sum(r.samples for r in runs)
    gpu = [r.peak_gpu for r in runs if r.peak_gpu is not None]
    entry: dict[str, Any] = {
        "contender": name,
        "samples_per_s": statistics.median(sps),
        "samples_per_s_min": min(sps),
        "samples_per_s_max": max(sps),
    }
    payloads = [r.payload_bytes for r in runs if r.payload_bytes is not None]
    if payloads:
        per_sample = sum(payloads) / samples
        entry["bytes_per_sample"] = per_sample
        for key, value in (("", statistics.median(sps)), ("_min", min(sps)), ("_max", max(sps))):
            entry[f"mb_per_s{key}"] = value * per_sample / MB
    cpu = [r.cpu_s for r in runs if r.cpu_s is not None]
    if cpu:
        entry["cpu_ms_per_sample"] = 1000 * sum(cpu) / samples
    verdict = "input-bound" if wait > threshold else "compute-bound"
    return {
        **entry,
        "wait_fraction": wait,
        "verdict": verdict if judged else "-",
        "wait_ms_per_step": 1000 * sum(r.wait_s for r in runs) / steps,
        "copy_ms_per_step": 1000 * sum(r.copy_s for r in runs) / steps,
        "compute_ms_per_step": 1000 * sum(r.compute_s for r in runs) / steps,
        "first_batch_s": statistics.median(r.first_batch_s for r in runs),
        "peak_rss_mb": max(r.peak_rss for r in runs) / MB,
        "peak_gpu_mb": max(gpu) / MB if gpu and torch.cuda.is_available() else None,
        "runs": [r.record() for r in runs],
    }


def window(default: tuple[int, int], warmup: int | None, steps: int | None) -> tuple[int, int]:
    """A profile's ``(warmup, steps)``, unless ``--warmup`` or ``--steps`` say otherwise."""
    return (default[0] if warmup is None else warmup, default[1] if steps is None else steps)
