"""``python -m bench.io``: read wait against compute time, per format, against raw files and webdataset.

For each profile (and cache state), every contender runs ``--repeats`` times in rounds (``bench.io.run``)
so drift on a noisy machine hits all contenders alike: the byte profiles (``bench.io.byte_profiles``), or
with ``--profile images`` or ``--data PACK`` the image profiles (``bench.io.image_profiles``). See
``bench.io.report`` for the output, ``bench.io.targets`` for the targets judged, and
``bench.common.report`` for the files it is written to and the section of ``docs/benchmarks.md`` that
``--docs`` writes (one per kind of run: ``bench-io``, ``bench-io-workers-0``, ``bench-io-images``,
``bench-io-remote``, ``bench-io-cold``; never for ``--data``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from bench.common.report import Chart, DocsSection, Run, write_report
from bench.io import (
    byte_profiles,
    byte_report,
    contenders,
    image_profiles,
    image_report,
    random_access,
    remote_contenders,
    report,
    targets,
    text_profile,
)
from bench.io.image_contenders import DATA_NAMES, FUSED_DEVICE, IMAGE_NAMES
from bench.io.remote import DEFAULT_BANDWIDTH, DEFAULT_LATENCY_S

DEFAULT_WORKERS = 2  # the issues' targets are set at two DataLoader workers


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.io", description=__doc__.split("\n")[0])
    p.add_argument(
        "--profile",
        choices=["small", "large", "both", "images", "random", "text"],
        default="both",
        help="images: the image profiles (images: ImageNet-size photos, images-large: camera-size photos); "
        "random: random gets by position, local and from S3 (bench.io.random_access); "
        "text: JSON records and token arrays stored with and without --compress zstd",
    )
    p.add_argument(
        "--data",
        type=Path,
        metavar="PACK",
        help="your own pack (a shardpipe dataset folder): the image measurement on it, and a verdict",
    )
    p.add_argument("--field", default="jpg", help="--data: the image field (default jpg)")
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        help="images: add shardpipe-fused-device, the crops decoded in the trainer process on this device "
        "(RandomResizedCrop(224, device=...)); cuda: against a ResNet-50-sized training step",
    )
    p.add_argument("--quick", action="store_true", help="small data, short windows, 1 repeat (< 1 min)")
    p.add_argument("--compute-ms", type=float, default=0.0, help="CPU compute step per batch; 0 = pure read")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        help=f"DataLoader workers (and pack workers); --docs: a section for {DEFAULT_WORKERS}, one for 0",
    )
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
        "--remote",
        action="store_true",
        help="read the tar shards from a loopback S3 server (cold and warm cache) beside the local copy "
        "and webdataset over the same server; the small profile unless --profile says otherwise",
    )
    p.add_argument(
        "--latency-ms", type=float, default=DEFAULT_LATENCY_S * 1000, help="--remote: latency per request"
    )
    p.add_argument(
        "--bandwidth-mb",
        type=float,
        default=DEFAULT_BANDWIDTH / 1e6,
        help="--remote: MB/s per response (0: no cap)",
    )
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument(
        "--docs",
        type=Path,
        help="also write this run's section of this Markdown page (make bench-io: docs/benchmarks.md) "
        "and its plot to img/<section>.png beside it",
    )
    p.add_argument(
        "--cache", type=Path, help="data cache, reused by fingerprint (default bench-results/cache)"
    )
    args = p.parse_args(argv)
    if args.profile in ("random", "text"):
        _check_numbers(p, args)
        return _resolved(args)
    images = args.profile == "images" or args.data is not None
    if args.device is not None and args.profile != "images":
        p.error("--device decodes the image crops: it goes with --profile images")
    if images:
        _check_images(p, args)
        return _resolved(args)
    names = [n for n in (args.contenders or ",".join(contenders.NAMES)).split(",") if n]
    if args.checks:
        names += [n for n in contenders.CHECK_OFF if n not in names]
    if args.remote:
        names = list(remote_contenders.NAMES)
        contenders.BUILDERS.update(
            dict.fromkeys(names, contenders.BUILDERS["shardpipe-tar"])
        )  # see remote_contenders.measure
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
    if args.device is not None:
        _check_device(p, args)
    valid = DATA_NAMES if args.data is not None else IMAGE_NAMES
    if args.device is not None and args.data is None:
        valid = (*valid, FUSED_DEVICE)
    names = [n for n in (args.contenders or ",".join(valid)).split(",") if n]
    unknown = sorted(set(names) - set(valid))
    if unknown:
        p.error(f"unknown contender(s) {', '.join(unknown)}; choose from {', '.join(valid)}")
    args.contenders = names
    _check_numbers(p, args)


def _check_device(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--device``: a device that is here, nvImageCodec to decode on it, and no docs section (the page
    keeps the default run's)."""
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(
            "--device cuda: no CUDA device here (torch.cuda.is_available() is False); --device cpu runs "
            "the same code on nvImageCodec's CPU backend"
        )
    from loaders.images import nvimgcodec

    if not nvimgcodec.available():
        p.error(
            "--device decodes with nvImageCodec, which is not installed: pip install 'shardpipe[nvimgcodec]'"
        )
    if args.docs is not None:
        p.error("--device runs are not written to the docs page; drop --docs (the report goes to --out)")


def _resolved(args: argparse.Namespace) -> argparse.Namespace:
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.cache = args.cache or Path("bench-results") / "cache"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # the main process shares the cores with the workers, as in real training
    if args.profile == "random":
        return random_access.main(args)
    if args.profile == "text":
        if args.docs and args.workers != DEFAULT_WORKERS:
            raise SystemExit(f"--docs keeps the text section for --workers {DEFAULT_WORKERS}")
        return text_profile.main(args, argv)
    section = _kind(args) if args.docs and args.data is None else None  # before measuring: it may refuse
    if args.data is not None:
        meta, results = image_profiles.run_data(args)
    elif args.profile == "images":
        meta, results = image_profiles.run_profiles(args)
    else:
        meta, results = byte_profiles.run(args)
    kind: report.Kind = image_report if args.profile == "images" or args.data is not None else byte_report
    words = tuple(sys.argv[1:] if argv is None else argv)
    run = Run("bench.io", words, dict(vars(args)), meta["hardware"], meta["versions"])  # as measured
    chart = Chart(kind.FIGURE, lambda path: kind.chart(path, meta, results), kind.CAPTION)
    docs = None if section is None else _docs(args.docs, section, meta, kind.docs_results(meta, results))
    if args.docs and args.data is not None:
        print(f"--data: your pack's figures stay in {args.out}, out of {args.docs}")
    record = {**meta, "results": results}
    paths = write_report(args.out, run, record, kind.markdown(meta, results), charts=[chart], docs=docs)
    print(kind.table(meta, results))
    if meta.get("targets"):
        print("\ntargets (paired ratios):\n" + "\n".join(targets.lines(meta["targets"])))
    if meta.get("verdicts"):
        print("\n" + "\n".join(meta["verdicts"]))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _kind(args: argparse.Namespace) -> tuple[str, str]:
    """The docs section of a run, and its title: a run with ``--workers 0`` has its own section, so the
    default's is never replaced by it."""
    if args.profile == "images":
        return "bench-io-images", "training input from JPEG photos"
    if args.remote:
        return "bench-io-remote", "reading from S3"
    if args.cold:
        return "bench-io-cold", "read wait, warm and cold page cache"
    if args.workers == 0:
        return "bench-io-workers-0", "read wait against compute time, read in the trainer (--workers 0)"
    if args.workers != DEFAULT_WORKERS:
        raise SystemExit(f"--docs keeps sections for --workers {DEFAULT_WORKERS} and 0, got {args.workers}")
    return "bench-io", "read wait against compute time"


def _docs(page: Path, section: tuple[str, str], meta: dict[str, Any], results: list[str]) -> DocsSection:
    """The run's ``section`` (name, title) of the docs page: tables as in report.md, after the flags the
    device, the loader's settings and each profile's data."""
    name, title = section
    settings = {
        "device": meta["device"],
        "loader": meta["settings"],
        **{f"data: {profile} profile": dataset for profile, dataset in meta["datasets"].items()},
    }
    return DocsSection(page, name, title, meta["rules"], results, settings)


if __name__ == "__main__":
    sys.exit(main())
