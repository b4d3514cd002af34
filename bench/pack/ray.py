"""Ray engine benchmark: the same pack driver on the local process pool and on a :class:`RayExecutor`.

Not wired into ``make bench-pack`` yet (the pack's ``executor=`` seam is being built). Until then both
contenders run the engine seam by hand with identical driver code: scan with ``pool=executor``, plan in
the driver, ``write_shard`` for every job on the executor; only the executor differs. Each executor is
started once, outside the timed rounds, and its start-up is reported on its own, so "as a user runs it"
is the pack time plus the start-up. Rounds alternate the order of the two contenders; medians and ranges
are reported, and the median of per-round ratios ("paired"), which cancels the machine's drift between
rounds.

Also measured: a local ``ray.init`` (start time, memory of its processes), the cost of a no-op task
through each executor, the listing rate (files scanned per second by ``scan_source``), and a two-node
``ray start --head`` + ``ray start --address`` on 127.0.0.1 (start times, memory).

``python -m bench.pack.ray [--small N] [--large N] [--repeats R] [--workers W] [--quick]`` writes
``bench-results/ray-pack/report.json`` and ``report.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from statistics import median
from typing import Any

import psutil

from bench.common.report import Run, write_report
from bench.common.system import ROOT
from bench.pack.data import Profile, build_tree, warm
from shardpipe.formats import get_format
from shardpipe.packing import PackOptions
from shardpipe.packing.engine import init_worker
from shardpipe.packing.plan import plan_jobs
from shardpipe.packing.ray_engine import RayExecutor
from shardpipe.packing.shard_writing import write_shard
from shardpipe.process_settings import pausing_gc
from shardpipe.shardtable import ShardEntry
from shardpipe.sources import scan_source
from shardpipe.storage import open_store
from testkit.ray_cluster import free_port, head_args, session_processes, start_node, stop_nodes, token_auth

FORMAT = "tar"
NOOP_TASKS = 400


def pack_on(executor: Executor, tree: Path, out: Path, options: PackOptions) -> list[ShardEntry]:
    """The pack's engine seam by hand: listing and shard writes on ``executor``, the plan in this process."""
    scan = scan_source(tree, pool=executor)
    jobs = plan_jobs(scan.table, get_format(options.format).suffix, options)
    out.mkdir(parents=True)
    store = open_store(out)
    return [f.result() for f in [executor.submit(write_shard, job, store, options.format) for job in jobs]]


def descendants_memory() -> dict[str, float]:
    """RSS and USS (MiB) summed over this process's live descendants: the processes a local Ray started."""
    rss = uss = 0
    for proc in psutil.Process().children(recursive=True):
        try:
            info = proc.memory_full_info()
        except psutil.Error:
            continue
        rss, uss = rss + info.rss, uss + info.uss
    return {"rss_mib": rss / 2**20, "uss_mib": uss / 2**20}


def per_task_ms(executor: Executor, count: int = NOOP_TASKS) -> float:
    """Milliseconds per no-op task when ``count`` are submitted at once (the executor's throughput cost)."""
    executor.submit(abs, 0).result()  # workers started
    start = time.perf_counter()
    futures = [executor.submit(abs, i) for i in range(count)]  # a builtin: nothing to import in a worker
    for future in futures:
        future.result()
    return (time.perf_counter() - start) / count * 1e3


def listing_rate(executor: Executor | None, tree: Path) -> float:
    start = time.perf_counter()
    scan = scan_source(tree, pool=executor)
    return len(scan.table) / (time.perf_counter() - start)


@contextmanager
def executors(workers: int) -> Iterator[tuple[dict[str, Executor], dict[str, Any]]]:
    """Both executors, started (and timed) once; the Ray one is a local Ray it starts itself."""
    started: dict[str, Any] = {}
    start = time.perf_counter()
    pool = ProcessPoolExecutor(max_workers=workers, initializer=init_worker)
    list(pool.map(abs, range(workers * 4)))
    started["local pool start_s"] = time.perf_counter() - start
    memory_before = descendants_memory()
    start = time.perf_counter()
    ray_engine = RayExecutor(max_workers=workers, initializer=init_worker)  # as the pool
    started["ray.init start_s"] = time.perf_counter() - start
    time.sleep(1.0)  # let Ray's daemons settle before reading their memory
    started["ray memory after init"] = _minus(descendants_memory(), memory_before)
    start = time.perf_counter()
    list(ray_engine.map(abs, range(workers * 4)))
    started["ray first tasks_s"] = time.perf_counter() - start
    started["ray memory with workers"] = _minus(descendants_memory(), memory_before)
    try:
        yield {"local pool": pool, "ray": ray_engine}, started
    finally:
        pool.shutdown()
        start = time.perf_counter()
        ray_engine.shutdown()
        started["ray shutdown_s"] = time.perf_counter() - start


def _minus(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in after}


def time_pack(
    profile: Profile, tree: Path, work: Path, engines: dict[str, Executor], repeats: int, shards: int
) -> list[dict[str, Any]]:
    max_samples = -(-profile.num_samples // shards)
    options = PackOptions(format=FORMAT, max_samples=max_samples, max_bytes=None)
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    names = list(engines)
    for round_index in range(repeats):
        for name in names[round_index % 2 :] + names[: round_index % 2]:
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            os.sync()
            start = time.perf_counter()
            with pausing_gc():
                entries = pack_on(engines[name], tree, out, options)
            seconds[name].append(time.perf_counter() - start)
            if sum(e.num_samples for e in entries) != profile.num_samples:
                raise RuntimeError(f"{name} packed {sum(e.num_samples for e in entries)} samples")
            print(f"  {profile.name} round {round_index + 1}: {name:10s} {seconds[name][-1]:7.3f} s")
    shutil.rmtree(work / "out", ignore_errors=True)
    local = seconds["local pool"]
    return [
        {
            "profile": profile.name,
            "engine": name,
            "samples": profile.num_samples,
            "sample_bytes": profile.sample_bytes,
            "shards": -(-profile.num_samples // max_samples),
            "seconds": times,
            "median_s": median(times),
            "samples_per_s": profile.num_samples / median(times),
            "mb_per_s": profile.num_samples * profile.sample_bytes / 1e6 / median(times),
            "throughput_vs_local": median(local) / median(times),
            "paired_throughput_vs_local": median(a / b for a, b in zip(local, times, strict=True)),
        }
        for name, times in seconds.items()
    ]


def cluster_start() -> dict[str, Any]:
    """A head and a second node on 127.0.0.1 (the tests' settings): start times and memory per node."""
    result: dict[str, Any] = {}
    with token_auth():
        nodes = []
        try:
            port = free_port()
            for label, args in (("head", head_args(port)), ("second", [f"--address=127.0.0.1:{port}"])):
                start = time.perf_counter()
                nodes.append(start_node(args))
                result[f"{label} start_s"] = time.perf_counter() - start
            time.sleep(2.0)
            for label, node in zip(("head", "second"), nodes, strict=True):
                procs = session_processes([node.process.pid])
                rss = sum(p.memory_info().rss for p in procs)
                result[f"{label} rss_mib"] = rss / 2**20
                result[f"{label} processes"] = len(procs)
        finally:
            stop_nodes(nodes)
    return result


def render(report: dict[str, Any]) -> str:
    lines = [
        "# Ray engine against the local process pool (shardpipe pack, tar)",
        "",
        f"{report['machine']['cpu']}, {report['machine']['cores_usable']} usable cores, "
        f"{report['machine']['ram_gib']} GiB; ray {report['versions'].get('ray', '?')}; "
        f"workers {report['parameters']['workers']}; {report['parameters']['repeats']} interleaved rounds; "
        "trees warm in the page cache; each executor started once, outside the timed rounds.",
        "",
        "| profile | engine | shards | median s (range) | samples/s | MB/s | vs local | vs local, paired |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["pack"]:
        lines.append(
            f"| {row['profile']} | {row['engine']} | {row['shards']} | {row['median_s']:.2f} "
            f"({min(row['seconds']):.2f}-{max(row['seconds']):.2f}) | {row['samples_per_s']:,.0f} | "
            f"{row['mb_per_s']:.1f} | {row['throughput_vs_local']:.2f}x | "
            f"{row['paired_throughput_vs_local']:.2f}x |"
        )
    lines += ["", "| cost | value |", "|---|---:|"]
    for key, value in report["costs"].items():
        shown = f"{value:,.2f}" if isinstance(value, float) else json.dumps(value)
        lines.append(f"| {key} | {shown} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pack.ray", description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=60_000, help="number of 1 KiB files")
    parser.add_argument("--large", type=int, default=8_000, help="number of 64 KiB files")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=8, help="shards (= write tasks) per profile")
    parser.add_argument("--quick", action="store_true", help="6,000 + 800 files, 2 rounds")
    parser.add_argument("--no-cluster", action="store_true", help="skip the two-node start measurement")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "ray-pack")
    parser.add_argument("--cache", type=Path, default=ROOT / "bench-results" / "pack-cache")
    args = parser.parse_args(argv)
    if args.quick:
        args.small, args.large, args.repeats = 6_000, 800, 2
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    profiles = [Profile("small", args.small, 1024), Profile("large", args.large, 64 * 1024)]
    started = time.perf_counter()
    costs: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    if not args.no_cluster:
        costs.update({f"cluster {k}": v for k, v in cluster_start().items()})
    with token_auth(), executors(args.workers) as (engines, start_costs):
        costs.update(start_costs)
        for name, executor in engines.items():
            costs[f"{name} no-op task ms"] = per_task_ms(executor)
        for profile in profiles:
            tree = build_tree(profile, args.cache)
            warm(tree)
            listers: dict[str, Executor | None] = {"sequential": None, **engines}
            for name, lister in listers.items():
                costs[f"{profile.name} listing files/s, {name}"] = listing_rate(lister, tree)
            print(f"{profile.name}: {profile.num_samples:,} x {profile.sample_bytes:,} B")
            rows += time_pack(profile, tree, args.cache / "work", engines, args.repeats, args.shards)
    costs.update({k: v for k, v in start_costs.items() if k not in costs})
    run = Run.of("bench.pack.ray", argv, args, ray=_ray_version())
    report = {
        "benchmark": "shardpipe pack: Ray engine vs local pool",
        "parameters": run.parameters,
        "machine": run.machine,
        "versions": run.versions,
        "pack": rows,
        "costs": costs,
        "elapsed_s": time.perf_counter() - started,
    }
    text = render(report)
    paths = write_report(args.out, run, report, text)
    print(text)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _ray_version() -> str:
    import ray

    version: str = ray.__version__
    return version


if __name__ == "__main__":
    sys.exit(main())
