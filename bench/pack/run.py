"""Timing one profile: every contender once per round, the order rotated between rounds.

``os.sync()`` runs, untimed, before every run, and every run's output is checked, untimed, before the next
(:mod:`bench.pack.checks`). A row per contender records its seconds per round, their median and min-max,
its CPU time (this process and its waited-for children), and its ratios to the profile's baseline: of the
medians, and paired (:func:`paired_ratio`, the median of per-round ratios, which cancels drift).
"""

from __future__ import annotations

import os
import resource
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from bench.pack.checks import check_output, check_prepared
from bench.pack.contenders import BARE_POOL, FLAT_PARQUET, IMAGE_LAYOUTS, TAR, Contender, shardpipe_cli
from bench.pack.data import ParquetProfile, PhotoProfile, Profile

STARTUP_REPEATS = 5  # runs of the 3-file pack that times the CLI's start-up


@dataclass(frozen=True, slots=True)
class Workload:
    """What one profile's rounds time: its tree, its size, the contender the others are divided by, and
    the check every contender's output must pass."""

    profile: str
    tree: Path
    num_samples: int
    payload_bytes: int
    baseline: str
    check: Callable[[Contender, Path], None]  # (contender, output folder) -> None; raises when wrong


def byte_workload(profile: Profile, tree: Path) -> Workload:
    return Workload(profile.name, tree, profile.num_samples, profile.payload_bytes, TAR,
                    lambda contender, out: check_output(contender, out, profile))  # fmt: skip


def parquet_workload(profile: ParquetProfile, tree: Path) -> Workload:
    """The parquet profile's rounds: every contender's manifest counts every row; the flat list is the
    baseline."""
    return Workload(
        profile=profile.name,
        tree=tree,
        num_samples=profile.num_samples,
        payload_bytes=profile.payload_bytes,
        baseline=FLAT_PARQUET,
        check=lambda contender, out: check_output(contender, out, profile),
    )


def image_workload(photos: PhotoProfile, tree: Path, payload_bytes: int) -> Workload:
    def check(contender: Contender, out: Path) -> None:
        try:
            check_prepared(IMAGE_LAYOUTS[contender.name], out, tree, photos)
        except RuntimeError as exc:
            raise RuntimeError(f"{contender.name} on {photos.name}: {exc}") from exc

    return Workload(photos.name, tree, photos.num_samples, payload_bytes, BARE_POOL, check)


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def time_profile(
    workload: Workload, work: Path, entries: Sequence[Contender], repeats: int, log: bool
) -> list[dict[str, Any]]:
    """Run every contender once per round, rotating the order; return one result row per contender."""
    entries = list(entries)
    name, num_samples, payload = workload.profile, workload.num_samples, workload.payload_bytes
    seconds: dict[str, list[float]] = {c.name: [] for c in entries}
    cpu: dict[str, list[float]] = {c.name: [] for c in entries}
    for round_index in range(repeats):
        shift = round_index % len(entries)
        for contender in entries[shift:] + entries[:shift]:
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            os.sync()
            cpu_before, start = _cpu_seconds(), time.perf_counter()
            contender.run(workload.tree, out)
            elapsed = time.perf_counter() - start
            cpu[contender.name].append(_cpu_seconds() - cpu_before)
            seconds[contender.name].append(elapsed)
            workload.check(contender, out)
            if log:
                print(f"  {name} round {round_index + 1}: {contender.name:45s} {elapsed:7.3f} s")
    shutil.rmtree(work / "out", ignore_errors=True)
    rows: list[dict[str, Any]] = []
    for contender in entries:
        times = seconds[contender.name]
        mid = median(times)
        rows.append(
            {
                "profile": name,
                "contender": contender.name,
                "kind": contender.kind,
                "samples": num_samples,
                "payload_bytes": payload,
                "seconds": times,
                "median_s": mid,
                "min_s": min(times),
                "max_s": max(times),
                "cpu_s": median(cpu[contender.name]),
                "samples_per_s": num_samples / mid,
                "samples_per_s_range": [num_samples / max(times), num_samples / min(times)],
                "mb_per_s": payload / 1e6 / mid,
            }
        )
    base_rate = next(r["samples_per_s"] for r in rows if r["contender"] == workload.baseline)
    for row in rows:
        row["baseline"] = workload.baseline
        row["ratio_to_baseline"] = row["samples_per_s"] / base_rate
        row["paired_ratio_to_baseline"] = paired_ratio(seconds[workload.baseline], row["seconds"])
    return rows


def paired_ratio(baseline_seconds: list[float], seconds: list[float]) -> float:
    """Median over rounds of (baseline time / time): a throughput ratio between runs made back to back in
    the same round, so the machine's drift between rounds cancels out."""
    return median(base / own for base, own in zip(baseline_seconds, seconds, strict=True))


def cli_startup(workers: int, work: Path, repeats: int = STARTUP_REPEATS) -> float:
    """Median wall time of ``shardpipe pack`` on a 3-file tree: the CLI's fixed cost (interpreter, imports,
    worker pool, manifest), which a large pack pays once on top of its work."""
    tree = work / "startup-tree" / "class00"
    tree.mkdir(parents=True, exist_ok=True)
    for i in range(3):
        (tree / f"{i:08d}.bin").write_bytes(b"x")
    run = shardpipe_cli("tar", workers, 3)
    seconds = []
    for _ in range(repeats):
        out = work / "startup-out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        start = time.perf_counter()
        run(tree.parent, out)
        seconds.append(time.perf_counter() - start)
    shutil.rmtree(work / "startup-tree")
    shutil.rmtree(work / "startup-out")
    return median(seconds)
