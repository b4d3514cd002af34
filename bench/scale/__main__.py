"""``python -m bench.scale``: every plan-only case and the end-to-end runs, each in a fresh process; the
targets judged, the report written."""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import bench.scale
from bench.common.report import Chart, DocsSection, Run, write_report
from bench.scale import RULES, endtoend, manifests, plans, report

SAMPLES = (10**6, 10**7, 10**8, 10**9, 10**10)
WORLDS = (8, 1024)
SOURCES = (1, 3, 10, 100)
OLD_LIMITS = {1: 10**8, 3: 10**7, 10: 10**6, 100: 0}
"""The largest epoch layout 2 plans here: beyond, a worker needs minutes and gigabytes, and a mixture of
many sources takes the quota order's Python loop (tens of seconds at 10^6 samples)."""
END_TO_END = (10**6, 10**7, 10**8)
MANIFESTS = ((10**4, False), (10**4, True), (10**5, False), (10**5, True), (10**6, False))
"""(shards, listed in JSON): the JSON form stops at 10^5, where it already takes seconds."""
CAPTION = "time to a worker's first window and its peak plan memory against the epoch's samples"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    description = (bench.scale.__doc__ or "").split("\n")[0]
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=description)
    p.add_argument("--quick", action="store_true", help="epochs up to 10^8, world 8 only (about a minute)")
    p.add_argument("--no-end-to-end", action="store_true", help="the plan-only cases alone")
    p.add_argument("--out", type=Path, default=Path("bench-results") / "scale")
    p.add_argument("--cache", type=Path, default=Path("bench-results") / "cache", help="the packs' data")
    p.add_argument(
        "--docs", type=Path, help="write this run's section (bench-scale) of this Markdown page too"
    )
    return p.parse_args(argv)


def cases(quick: bool) -> list[plans.Case]:
    samples = SAMPLES[:3] if quick else SAMPLES
    worlds = WORLDS[:1] if quick else WORLDS
    out = []
    for n, world, k in itertools.product(samples, worlds, SOURCES):
        out.append(plans.Case("layout-3", n, k, world))
        if n <= OLD_LIMITS[k]:
            out.append(plans.Case("layout-2", n, k, world))
        if k == 1:  # Grain plans single datasets; its mixtures are a different pipeline
            out.append(plans.Case("grain", n, k, world))
    return out


def in_fresh_process(function: Any, *args: Any) -> Any:
    """Run ``function(*args)`` in a new spawned process: nothing cached or allocated before it counts."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(function, *args).result()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    results = []
    for case in cases(args.quick):
        timed = in_fresh_process(partial(plans.measure, traced=False), case)
        entry = {**timed, **in_fresh_process(partial(plans.measure, traced=True), case)}
        results.append(entry)
        print(
            f"  {case.label:50} {entry['first_window_s'] * 1e3:10.1f} ms {entry['peak_mb']:9.1f} MB",
            flush=True,
        )
    loads = []
    for shards, listed in MANIFESTS[:3] if args.quick else MANIFESTS:
        folder = manifests.prepare(
            args.cache / f"scale-manifest-{shards}-{int(listed)}", shards, listed=listed
        )
        loads.append(in_fresh_process(manifests.measure, str(folder), shards, listed))
        print(f"  manifest of {shards:.0e} shards, {loads[-1]['form']}: load {loads[-1]['load_s']:.3f} s, "
              f"peak RSS +{loads[-1]['peak_rss_growth_mb']:.0f} MB", flush=True)  # fmt: skip
    end_to_end = []
    if not args.no_end_to_end:
        packs = [str(p) for p in endtoend.prepare(args.cache)]
        for samples in END_TO_END[:2] if args.quick else END_TO_END:
            entry = in_fresh_process(endtoend.measure, packs, samples)
            end_to_end.append(entry)
            print(f"  mixture end to end N={samples:.0e}: first batch {entry['first_batch_s']:.2f} s, "
                  f"worker peak RSS {entry['worker_peak_rss_mb']:.0f} MB", flush=True)  # fmt: skip
    found = report.targets(results, end_to_end, loads)
    record_run = Run.of("bench.scale", argv, args)
    meta = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": round(time.perf_counter() - started, 1),
        "hardware": record_run.machine,
        "versions": record_run.versions,
        "parameters": record_run.parameters,
        "shard_samples": plans.SHARD_SAMPLES,
        "workers_per_rank": plans.WORKERS,
        "batch_size": plans.BATCH,
        "rules": RULES,
    }
    record = {**meta, "targets": found, "results": results, "end_to_end": end_to_end, "manifests": loads}
    chart = Chart("scale.png", lambda path: report.chart(path, results), CAPTION)
    lines = report.result_lines(results, end_to_end, loads, found)
    docs = None
    if args.docs is not None:
        settings = {
            "shard samples": plans.SHARD_SAMPLES,
            "workers a rank": plans.WORKERS,
            "batch": plans.BATCH,
        }
        docs = DocsSection(args.docs, "bench-scale", "what a plan costs a worker", RULES, lines, settings)
    print(*lines, sep="\n")
    markdown = "\n".join(["# bench-scale", "", *lines, ""])
    written = write_report(args.out, record_run, record, markdown, charts=[chart], docs=docs)
    print("wrote", ", ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
