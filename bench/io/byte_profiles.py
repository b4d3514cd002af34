"""The byte profiles of ``python -m bench.io``: ``small`` and ``large`` (``bench.io.data``), warm and, with
``--cold``, cold page cache, or read from a loopback S3 server (``--remote``, ``bench.io.remote_contenders``).

Every contender of ``bench.io.contenders`` runs in the rounds of ``bench.io.run`` per profile and cache
state; its MB/s is set against the physical floor (one sequential pass over the tar shards) and the
in-memory ceiling, and every format's ``-cls`` row is judged against its raw-bytes row
(``bench.io.targets``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import system
from bench.io import byte_report, contenders, data, remote_contenders, report, targets
from bench.io.compute import BusyStep, Step, make_step
from bench.io.run import Run, rounds, run_once, window


def run(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The profiles ``--profile`` names: (meta, results), the targets in ``meta["targets"]``."""
    started = time.perf_counter()
    profiles = data.QUICK_PROFILES if args.quick else data.PROFILES
    windows = data.QUICK_WINDOWS if args.quick else data.WINDOWS
    names = ["small", "large"] if args.profile == "both" else [args.profile]
    caches = ["warm", "cold"] if args.cold else ["warm"]
    settings = contenders.LoaderSettings(args.batch_size, args.workers)
    eviction = system.check_eviction(args.cache) if args.cold else None
    results: list[dict[str, Any]] = []
    datasets: dict[str, Any] = {}
    for profile_name in names:
        profile = profiles[profile_name]
        dataset = data.prepare(profile, args.cache, workers=max(args.workers, 1))
        warmup, steps = window(windows[profile_name], args.warmup, args.steps)
        step = make_step(args.compute_ms, profile.sample_bytes)
        datasets[profile_name] = {
            "profile": profile.name,
            "fingerprint": profile.fingerprint,
            "num_samples": profile.num_samples,
            "mean_sample_bytes": dataset.payload_bytes / profile.num_samples,
            "warmup_steps": warmup,
            "measured_steps": steps,
            "compute_flops_per_step": step.flops if isinstance(step, BusyStep) else None,
            "compute_iterations": step.iterations if isinstance(step, BusyStep) else None,
        }
        if args.remote:
            results.extend(
                remote_contenders.measure(args, dataset, settings, step, warmup, steps, profile_name)
            )
            continue
        if "warm" in caches:
            system.settle(
                sorted({p for name in args.contenders for p in contenders.files_read(name, dataset)})
            )
        for cache in caches:
            floor = system.floor(dataset.shard_files("tar"), dataset.payload_bytes, cold=cache == "cold")
            runs = _rounds(args, dataset, settings, step, (warmup, steps), profile_name, cache)
            results.extend(
                byte_report.byte_entries(
                    runs, args.threshold, floor, profile=profile_name, cache=cache, eviction=eviction
                )
            )
    rules = {**byte_report.RULES, "targets": targets.RULE}
    meta = report.meta(args, started, datasets, settings, rules)
    meta.update(eviction=eviction, targets=targets.cls_targets(results, args.workers))
    return meta, results


def _rounds(
    args: argparse.Namespace,
    dataset: data.Dataset,
    settings: contenders.LoaderSettings,
    step: Step,
    window: tuple[int, int],
    profile: str,
    cache: str,
) -> dict[str, list[Run]]:
    """Every contender ``--repeats`` times, in rounds, on one profile in one cache state."""
    cold = cache == "cold"

    def one(name: str) -> Run:
        return run_once(name, dataset, settings, step, warmup=window[0], steps=window[1], cold=cold)

    def show(repeat: int, name: str, run: Run) -> None:
        print(
            f"  {profile:5} {cache} #{repeat + 1} {name:18} {run.samples_per_s:11,.0f} samples/s"
            f"  wait {run.wait_fraction:4.0%}  first batch {run.first_batch_s:.2f} s",
            flush=True,
        )

    return rounds(args.contenders, args.repeats, one, show)
