"""``python -m bench``: read wait against compute time, per format, against raw files and webdataset.

For each profile (and cache state), every contender runs ``--repeats`` times, interleaved (repeat r of
every contender before repeat r + 1 of any, the order rotated each repeat) so drift on a noisy machine hits
all contenders alike. See ``bench.run`` for the warm-up and measurement rules, ``bench.report`` for output,
``bench.targets`` for the targets judged, and ``bench.docs_page`` for the section of ``docs/benchmarks.md``
that ``--docs`` writes (one per kind of run: ``bench-io``, ``bench-io-workers-0``, ``bench-io-images``,
``bench-io-remote``, ``bench-io-cold``). ``--profile images`` and ``--data PACK`` measure image input instead
(``bench.image_bench``).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bench import contenders, data, image_bench, image_report, remote_io, report
from bench import targets as targets_module
from bench.common import docs_page, system
from bench.compute import BusyStep, make_step
from bench.image_contenders import DATA_NAMES, IMAGE_NAMES
from bench.run import run_once, summarize

# (warmup, steps) per profile: the window must fit in one epoch of the profile's data.
WINDOWS = {"small": (10, 400), "large": (10, 150)}
QUICK_WINDOWS = {"small": (3, 30), "large": (2, 8)}
DEFAULT_WORKERS = 2  # the issues' targets are set at two DataLoader workers


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument(
        "--profile", choices=["small", "large", "both", "images"], default="both",
        help="images: the image profiles (images: ImageNet-size photos, images-large: camera-size photos)",
    )  # fmt: skip
    p.add_argument(
        "--data", type=Path, metavar="PACK",
        help="your own pack (a shardpipe dataset folder): the image measurement on it, and a verdict",
    )  # fmt: skip
    p.add_argument("--field", default="jpg", help="--data: the image field (default jpg)")
    p.add_argument("--quick", action="store_true", help="small data, short windows, 1 repeat (< 1 min)")
    p.add_argument("--compute-ms", type=float, default=0.0, help="CPU compute step per batch; 0 = pure read")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--workers", type=int, default=DEFAULT_WORKERS,
        help=f"DataLoader workers (and pack workers); --docs: a section for {DEFAULT_WORKERS}, one for 0",
    )  # fmt: skip
    p.add_argument("--repeats", type=int, help="runs per contender (default 3, --quick 1)")
    p.add_argument("--warmup", type=int, help="discarded steps per run (default per profile)")
    p.add_argument("--steps", type=int, help="measured steps per run (default per profile)")
    p.add_argument("--threshold", type=float, default=0.1, help="wait fraction above which: input-bound")
    p.add_argument("--cold", action="store_true", help="also run with the files evicted from the page cache")
    p.add_argument(
        "--contenders",
        help="comma-separated subset (default: every contender of the kind of run), or variants: "
        + ", ".join(contenders.VARIANTS),
    )
    p.add_argument(
        "--checks", action="store_true", help="add shardpipe-*-nocheck contenders: the price of the checks"
    )
    p.add_argument(
        "--remote", action="store_true",
        help="read the tar shards from a loopback S3 server (cold and warm cache) beside the local copy "
        "and webdataset over the same server; the small profile unless --profile says otherwise",
    )  # fmt: skip
    p.add_argument("--latency-ms", type=float, default=20.0, help="--remote: latency per request")
    p.add_argument(
        "--bandwidth-mb", type=float, default=200.0, help="--remote: MB/s per response (0: no cap)"
    )
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument(
        "--docs",
        type=Path,
        help="also write this run's section of this Markdown page (make bench-io: docs/benchmarks.md) "
        "and its plot to img/bench-io.png beside it",
    )
    p.add_argument(
        "--cache", type=Path, help="data cache, reused by fingerprint (default bench-results/cache)"
    )
    args = p.parse_args(argv)
    images = args.profile == "images" or args.data is not None
    if images:
        _check_images(p, args)
        return _resolved(args)
    names = [n for n in (args.contenders or ",".join(contenders.NAMES)).split(",") if n]
    if args.checks:
        names += [n for n in contenders.CHECK_OFF if n not in names]
    if args.remote:
        names = list(remote_io.NAMES)
        contenders.BUILDERS.update(
            dict.fromkeys(names, contenders.BUILDERS["shardpipe-tar"])
        )  # see remote_io.measure
        if args.profile == "both":
            args.profile = "small"
    unknown = sorted(set(names) - set(contenders.BUILDERS))
    if unknown:
        p.error(f"unknown contender(s) {', '.join(unknown)}; choose from {', '.join(contenders.BUILDERS)}")
    args.contenders = names
    _check_numbers(p, args)
    return _resolved(args)


def _check_numbers(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for flag in ("batch_size", "repeats", "steps"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.workers < 0 or (args.warmup is not None and args.warmup < 0):
        p.error("--workers and --warmup must be >= 0")
    if not 0 <= args.threshold <= 1:
        p.error(f"--threshold must be in [0, 1], got {args.threshold}")


def _check_images(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The image runs' arguments: their own contenders, none of the byte profiles' modes."""
    for flag in ("remote", "cold", "checks"):
        if getattr(args, flag):
            p.error(f"--{flag} measures the byte profiles; it does not go with --profile images or --data")
    if args.data is not None:
        if args.profile not in ("both", "images"):
            p.error(f"--data measures your pack; drop --profile {args.profile}")
        manifest = args.data / "manifest.json" if args.data.is_dir() else args.data
        if not manifest.is_file():
            p.error(f"--data {args.data}: no shardpipe dataset there (expected {manifest})")
        from shardpipe.manifest import load_manifest

        fields = load_manifest(args.data).fields
        if args.field not in fields:
            p.error(f"--field {args.field}: the pack's fields are {', '.join(fields)}")
    valid = DATA_NAMES if args.data is not None else IMAGE_NAMES
    names = [n for n in (args.contenders or ",".join(valid)).split(",") if n]
    unknown = sorted(set(names) - set(valid))
    if unknown:
        p.error(f"unknown contender(s) {', '.join(unknown)}; choose from {', '.join(valid)}")
    args.contenders = names
    _check_numbers(p, args)


def _resolved(args: argparse.Namespace) -> argparse.Namespace:
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.cache = args.cache or Path("bench-results") / "cache"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # the main process shares the cores with the workers, as in real training
    if args.profile == "images" or args.data is not None:
        return _images(args, sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    profiles = data.QUICK_PROFILES if args.quick else data.PROFILES
    windows = QUICK_WINDOWS if args.quick else WINDOWS
    names = ["small", "large"] if args.profile == "both" else [args.profile]
    caches = ["warm", "cold"] if args.cold else ["warm"]
    settings = contenders.LoaderSettings(args.batch_size, args.workers)
    eviction = system.check_eviction(args.cache) if args.cold else None
    results: list[dict[str, Any]] = []
    datasets: dict[str, Any] = {}
    for profile_name in names:
        profile = profiles[profile_name]
        dataset = data.prepare(profile, args.cache, workers=max(args.workers, 1))
        warmup, steps = windows[profile_name]
        warmup = warmup if args.warmup is None else args.warmup
        steps = steps if args.steps is None else args.steps
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
            results.extend(remote_io.measure(args, dataset, settings, step, warmup, steps, profile_name))
            continue
        for cache in caches:
            floor = system.floor(dataset.shard_files("tar"), dataset.payload_bytes, cold=cache == "cold")
            runs: dict[str, list[Any]] = {n: [] for n in args.contenders}
            for repeat in range(args.repeats):
                shift = repeat % len(args.contenders)
                for name in args.contenders[shift:] + args.contenders[:shift]:
                    run = run_once(
                        name, dataset, settings, step, warmup=warmup, steps=steps, cold=cache == "cold"
                    )
                    runs[name].append(run)
                    print(
                        f"  {profile_name:5} {cache} #{repeat + 1} {name:18} "
                        f"{run.samples_per_s:11,.0f} samples/s"
                        f"  wait {run.wait_fraction:4.0%}  first batch {run.first_batch_s:.2f} s",
                        flush=True,
                    )
            entries = [summarize(n, runs[n], args.threshold) for n in args.contenders]
            report.add_ratios(entries, floor["payload_mb_per_s"])
            for entry in entries:
                entry.update(profile=profile_name, cache=cache, floor=floor, eviction=eviction)
            results.extend(entries)
    meta = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": round(time.perf_counter() - started, 1),
        "hardware": system.hardware(),
        "versions": system.versions(),
        "datasets": datasets,
        "parameters": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "settings": {
            **asdict(settings),
            "shuffle_buffer": contenders.SHUFFLE_BUFFER,
            "seed": contenders.SEED,
        },
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "rules": {**report.RULES, "targets": targets_module.RULE},
        "eviction": eviction,
    }
    found = targets_module.cls_targets(results, args.workers)
    meta["targets"] = found
    paths = report.write(args.out, meta, results)
    if args.docs:
        kind, title = _kind(args)
        figure = docs_page.Figure(
            args.out / "throughput.png",
            f"{kind}.png",
            f"{kind}: payload MB/s per contender (median of repeats, bars min-max; orange: input-bound)",
        )
        results_lines = report.docs_results(meta, results)
        paths += docs_page.publish(
            args.docs,
            _section(kind, title, meta, results_lines, figure, args, sys.argv[1:] if argv is None else argv),
        )
    print(report.table(results))
    if found:
        print("\ntargets (paired ratios):\n" + "\n".join(targets_module.lines(found)))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _kind(args: argparse.Namespace) -> tuple[str, str]:
    """The docs section of a raw-bytes run, and its title: a run with ``--workers 0`` has its own
    section, so the default's is never replaced by it."""
    if args.remote:
        return "bench-io-remote", "reading from S3"
    if args.cold:
        return "bench-io-cold", "read wait, warm and cold page cache"
    if args.workers == 0:
        return "bench-io-workers-0", "read wait against compute time, read in the trainer (--workers 0)"
    if args.workers != DEFAULT_WORKERS:
        raise SystemExit(f"--docs keeps sections for --workers {DEFAULT_WORKERS} and 0, got {args.workers}")
    return "bench-io", "read wait against compute time"


def _images(args: argparse.Namespace, argv: list[str]) -> int:
    """``--profile images`` (its docs section: bench-io-images) or ``--data`` (never in the docs)."""
    found: list[dict[str, Any]] = []
    if args.data is not None:
        meta, results = image_bench.run_data(args)
    else:
        meta, results, found = image_bench.run_profiles(args)
    paths = image_report.write(args.out, meta, results, found)
    if args.docs and args.data is None:
        figure = docs_page.Figure(
            args.out / "images.png",
            "bench-io-images.png",
            "bench-io-images: samples/s per contender (median of repeats, bars min-max; grey: decode alone)",
        )
        lines = image_report.docs_results(meta, results, found)
        title = "training input from JPEG photos"
        paths += docs_page.publish(
            args.docs, _section("bench-io-images", title, meta, lines, figure, args, argv)
        )
    elif args.docs:
        print(f"--data: your pack's figures stay in {args.out}, out of {args.docs}")
    print(image_report.table(meta, results, found))
    if meta.get("verdicts"):
        print("\n" + "\n".join(meta["verdicts"]))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _section(
    name: str, title: str, meta: dict[str, Any], results: list[str], figure: docs_page.Figure,
    args: argparse.Namespace, argv: list[str],
) -> docs_page.Section:  # fmt: skip
    """This run as its section of the docs page: tables as in report.md, the plot as img/<name>.png."""
    settings = {
        **docs_page.flags(vars(args)),
        "device": meta["device"],
        "loader": meta["settings"],
        **{f"data: {profile} profile": dataset for profile, dataset in meta["datasets"].items()},
    }
    return docs_page.Section(
        name=name,
        title=f"{name}: {title}",
        date=docs_page.utc_date(),
        command=docs_page.command_line("bench", argv),
        machine=meta["hardware"],
        versions=meta["versions"],
        settings=settings,
        rules=meta["rules"],
        results=results,
        figures=(figure,),
    )


if __name__ == "__main__":
    sys.exit(main())
