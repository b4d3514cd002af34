"""``python -m bench.shuffle``: run every configuration on both packs, judge the targets, write the report."""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bench.common import system
from bench.common.report import Chart, DocsSection, Run, write_report
from bench.io.contenders import LoaderSettings
from bench.shuffle import RULES, contenders, data, report
from bench.shuffle.quality import evaluate

FULL = {
    "classes": 100,
    "per_class": 600,
    "shard_samples": 1000,
    "buffers": "256,1024,4096,8192",
    "blocks": "1,4,16,64,256",
}
CAPTION = "classes per batch (x ideal) and read samples/s against samples held per worker"
SPREAD = (
    "the grid's speeds are single runs, a rough guide; the speed target's runs are given min-max beside its"
    " ratio of medians"
)
QUICK = {"classes": 100, "per_class": 150, "shard_samples": 250, "buffers": "1024,4096", "blocks": "1,16,256"}


def _ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need comma-separated integers >= 1, got {text!r}")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.shuffle", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer samples per class, a smaller grid (< 1 min)")
    p.add_argument("--classes", type=int, help=f"classes (default {FULL['classes']})")
    p.add_argument("--per-class", type=int, help=f"samples per class (default {FULL['per_class']})")
    p.add_argument("--shard-samples", type=int, help=f"samples per shard (default {FULL['shard_samples']})")
    p.add_argument(
        "--buffers", type=_ints, help=f"shuffle_buffer / webdataset n grid (default {FULL['buffers']})"
    )
    p.add_argument("--blocks", type=_ints, help=f"block_size grid (default {FULL['blocks']})")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--epochs", type=int, default=2, help="epochs per contender (>= 2 for the epoch correlation)"
    )
    p.add_argument("--warmup", type=int, default=5, help="batches per epoch before the read clock starts")
    p.add_argument(
        "--repeats", type=int, help="interleaved runs of the defaults/reference pair (default 5, --quick 3)"
    )
    p.add_argument(
        "--speed-samples", type=int, help="samples per pair run (default 600,000, --quick 100,000)"
    )
    p.add_argument("--out", type=Path, default=Path("bench-results") / "shuffle")
    p.add_argument(
        "--docs",
        type=Path,
        help="also write this run's section of this Markdown page (make bench-shuffle: docs/benchmarks.md) "
        "and its plot to img/bench-shuffle.png beside it",
    )
    p.add_argument("--cache", type=Path, default=Path("bench-results") / "cache")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for name in ("classes", "per_class", "shard_samples"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    args.buffers = args.buffers or _ints(str(preset["buffers"]))
    args.blocks = args.blocks or _ints(str(preset["blocks"]))
    args.repeats = args.repeats or (3 if args.quick else 5)
    args.speed_samples = args.speed_samples or (100_000 if args.quick else 600_000)
    for name in ("batch_size", "workers", "epochs", "warmup", "repeats", "speed_samples"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def _entry(
    pack: data.Pack, config: contenders.Config, settings: LoaderSettings, args: argparse.Namespace
) -> dict[str, Any]:
    built = contenders.build(config, pack, settings)
    runs = contenders.run_epochs(built, args.epochs, args.warmup)
    held = {
        "shuffle_buffer": built.shuffle_buffer,
        "block_size": built.block_size,
        "memory_samples": built.memory_samples,
    }
    del built
    gc.collect()  # persistent workers go before the next contender starts its own
    quality = evaluate(pack, runs, args.batch_size, args.classes)
    speeds = [r.samples_per_s for r in runs]
    return {
        "pack": pack.name,
        "family": config.family,
        "label": config.label,
        "is_default": config.is_default,
        **held,
        "samples_per_s": statistics.median(speeds),
        "samples_per_s_epochs": speeds,
        **asdict(quality),
    }


def _docs(
    page: Path, meta: dict[str, Any], results: list[dict[str, Any]], found: list[dict[str, Any]], loader: Any
) -> DocsSection:
    """This run's section of the docs page: the loader's settings, the grid's speeds as a rough guide."""
    rules = {**RULES, "spread": SPREAD}
    lines = [
        f"\\* = shardpipe's defaults ({meta['defaults']}); one rank.",
        "",
        *report.result_lines(meta, results, found, "####"),
    ]
    settings = {**{k: meta[k] for k in ("profile", "num_shards", "defaults")}, "loader": loader}
    return DocsSection(page, "bench-shuffle", "how well batches mix", rules, lines, settings)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    profile = data.Profile(args.classes, args.per_class, args.shard_samples)
    packs = data.prepare(profile, args.cache)
    settings = LoaderSettings(args.batch_size, args.workers)
    results: list[dict[str, Any]] = []
    speed: dict[str, dict[str, list[float]]] = {}
    for pack in packs.values():
        system.read_all(pack.shard_files)  # warm cache
        for config in contenders.grid(args.buffers, args.blocks):
            entry = _entry(pack, config, settings, args)
            results.append(entry)
            print(
                f"  {pack.name:6} {config.label:32} classes {entry['classes_per_batch']:5.1f} "
                f"({entry['classes_ratio']:.2f}x)  {entry['samples_per_s']:9,.0f} samples/s",
                flush=True,
            )
        speed_epochs = -(-args.speed_samples // profile.num_samples)  # enough epochs for a steady clock
        pair = {"default": contenders.DEFAULT, "reference": contenders.REFERENCE_CONFIG}
        speed[pack.name] = {name: [] for name in pair}
        for repeat in range(args.repeats):
            for name in list(pair)[repeat % 2 :] + list(pair)[: repeat % 2]:  # rotate who goes first
                built = contenders.build(pair[name], pack, settings)
                runs = contenders.run_epochs(built, speed_epochs, args.warmup)
                speed[pack.name][name].append(
                    sum(r.timed_samples for r in runs) / sum(r.seconds for r in runs)
                )
                del built
                gc.collect()
    found = report.targets(results, speed)
    default = next(e for e in results if e["is_default"])
    run = Run.of("bench.shuffle", argv, args)
    meta: dict[str, Any] = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": round(time.perf_counter() - started, 1),
        "hardware": run.machine,
        "versions": run.versions,
        "profile": {
            **asdict(profile),
            "fingerprint": profile.fingerprint,
            "hashed_by": "shardpipe pack --order hashed",
        },
        "num_shards": len(next(iter(packs.values())).shard_sizes),
        "defaults": f"shuffle_buffer={default['shuffle_buffer']}, block_size={default['block_size']}",
        "parameters": run.parameters,
        "speed": speed,
        "rules": RULES,
    }
    record = {**meta, "targets": found, "results": results}
    chart = Chart("quality.png", lambda path: report.chart(path, results), CAPTION)
    docs = None if args.docs is None else _docs(args.docs, meta, results, found, asdict(settings))
    paths = write_report(
        args.out, run, record, report.markdown(meta, results, found), charts=[chart], docs=docs
    )
    print(report.table(results))
    print("\n" + "\n".join(report.target_lines(found)))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
