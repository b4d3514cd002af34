"""``python -m bench.pack``: every profile's rounds, the CLI's start-up, the targets judged, the report."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import bench.pack
from bench.common.report import Chart, DocsSection, Run, write_report
from bench.common.system import ROOT, compile_sources
from bench.pack import report
from bench.pack.contenders import (
    ENGINES,
    IMAGE_MAX_SIDE,
    IMAGE_QUALITY,
    Contender,
    contenders,
    image_contenders,
    parquet_contenders,
)
from bench.pack.data import (
    ParquetProfile,
    PhotoProfile,
    Profile,
    build_parquet,
    build_photo_tree,
    build_tree,
    warm,
)
from bench.pack.run import (
    Workload,
    byte_workload,
    cli_startup,
    image_workload,
    parquet_workload,
    time_profile,
)
from bench.pack.targets import targets

PROFILES = ("small", "large", "images", "parquet")
WARM = "each tree read once before its profile's rounds"


def _profile_names(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in PROFILES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected profile names of {', '.join(PROFILES)}, comma-separated; got {text!r}"
        )
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    description = (bench.pack.__doc__ or "").split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.pack", description=description)
    parser.add_argument("--small", type=int, default=60_000, help="number of 1 KiB files")
    parser.add_argument("--large", type=int, default=8_000, help="number of 64 KiB files")
    parser.add_argument("--images", type=int, default=2_000, help="number of photos (about 500x375 JPEG)")
    parser.add_argument(
        "--parquet", type=int, default=20_000, help="number of Parquet rows of 1 KiB binary plus an int label"
    )
    parser.add_argument(
        "--profile",
        type=_profile_names,
        default=PROFILES,
        help=f"comma-separated profiles to run, of {', '.join(PROFILES)} (default: all)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=8, help="shards per profile (sets --max-samples)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="3,000 + 300 files, 200 photos and 2,000 Parquet rows, 1 round: a smoke test",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "pack")
    parser.add_argument("--cache", type=Path, default=ROOT / "bench-results" / "pack-cache")
    parser.add_argument(
        "--only", help="comma-separated contender names to run (each profile's baseline always runs)"
    )
    parser.add_argument(
        "--docs",
        type=Path,
        help="also write this run's section of this Markdown page (make bench-pack: docs/benchmarks.md)",
    )
    parser.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="ray: add the Ray engine beside the local one",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.small, args.large, args.images, args.parquet, args.repeats = 3_000, 300, 200, 2_000, 1
    args.out, args.cache = args.out.resolve(), args.cache.resolve()  # the contenders run from ROOT
    return args


def _set_up(
    name: str, num_samples: int, max_samples: int, args: argparse.Namespace
) -> tuple[Workload, list[Contender], dict[str, Any]]:
    """A profile's tree (built or reused, then read once), its contenders and what the report records."""
    if name == "images":
        photos = PhotoProfile(name, num_samples, max_side=IMAGE_MAX_SIDE, quality=IMAGE_QUALITY)
        tree = build_photo_tree(photos, args.cache)
        files, total = warm(tree)
        if files != num_samples:
            raise RuntimeError(f"{tree}: {files} photos, expected {num_samples}; remove it to rebuild it")
        entries = image_contenders(args.workers, max_samples, photos)
        return image_workload(photos, tree, total), entries, {**asdict(photos), "payload_bytes": total}
    if name == "parquet":
        rows = ParquetProfile(name, num_samples)
        tree = build_parquet(rows, args.cache)
        warm(tree)
        entries = parquet_contenders(args.workers, max_samples)
        return parquet_workload(rows, tree), entries, asdict(rows)
    profile = Profile(name, num_samples, 1024 if name == "small" else 64 * 1024)
    tree = build_tree(profile, args.cache)
    files, total = warm(tree)
    assert (files, total) == (profile.num_samples, profile.payload_bytes), (files, total)
    entries = contenders(args.workers, max_samples, args.engine)
    return byte_workload(profile, tree), entries, asdict(profile)


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every selected profile's rounds: the result rows, and each profile as the report records it."""
    sizes = {"small": args.small, "large": args.large, "images": args.images, "parquet": args.parquet}
    rows: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    for name in [name for name in args.profile if sizes[name] > 0]:
        max_samples = -(-sizes[name] // args.shards)
        workload, entries, record = _set_up(name, sizes[name], max_samples, args)
        if args.only:
            wanted = {workload.baseline, *(name.strip() for name in args.only.split(","))}
            entries = [c for c in entries if c.name in wanted]
        profiles[name] = {
            **record,
            "max_samples": max_samples,
            "shards": -(-workload.num_samples // max_samples),
            "tree": str(workload.tree),
        }
        print(
            f"{name}: {workload.num_samples:,} {'rows' if name == 'parquet' else 'files'}, "
            f"{workload.payload_bytes / 2**20:,.1f} MiB, "
            f"{args.repeats} round(s)"
        )
        try:
            rows += time_profile(workload, args.cache / "work", entries, args.repeats, log=not args.quick)
        finally:
            for engine in ENGINES:
                engine.shutdown()
            ENGINES.clear()
    return rows, profiles


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    compile_sources()  # the CLI and script rows start fresh interpreters
    started = time.perf_counter()
    rows, profiles = measure(args)
    work = args.cache / "work"
    costs = {"cli_startup_s": cli_startup(args.workers, work)}
    shutil.rmtree(work, ignore_errors=True)
    params = {"repeats": args.repeats, "workers": args.workers, "quick": args.quick, "warm": WARM}
    run = Run.of("bench.pack", argv, args, tar=report.tar_version())
    record: dict[str, Any] = {
        "benchmark": "shardpipe pack",
        "parameters": {**params, "profiles": profiles},
        "machine": run.machine,
        "versions": run.versions,
        "results": rows,
        "costs": costs,
        "targets": targets(rows),
        "elapsed_s": time.perf_counter() - started,
    }
    text = report.render(record)
    docs = None
    if args.docs:
        settings = {"warm": WARM, **{f"profile {name}": prof for name, prof in profiles.items()}}
        docs = DocsSection(
            args.docs, "bench-pack", "pack throughput", report.RULES, report.tables(record), settings
        )
    figure = Chart("pack.png", lambda path: report.chart(path, record), "samples/s packed, per profile")
    paths = write_report(args.out, run, record, text, charts=[figure], docs=docs)
    print(text)
    print(f"wrote {', '.join(str(p) for p in paths)} ({record['elapsed_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
