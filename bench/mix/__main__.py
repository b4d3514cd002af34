"""``python -m bench.mix``: every contender's composition at every world size, the speed rounds, the
targets judged, the report written."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

import bench.mix
from bench.common.report import Chart, DocsSection, Run, write_report
from bench.mix import RULES, contenders, data, report, run
from loaders.planning.planner import DEFAULT_SHUFFLE_BUFFER

CAPTION = "composition error per kind of run (worst over epochs and world sizes), and read speed per round"
SPREAD = "the speed target is the median of the rounds' paired ratios, the rounds' min-max beside it"


def _values(kind: type, low: float) -> Any:
    def parse(text: str) -> list[Any]:
        try:
            values = [kind(v) for v in text.split(",") if v.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"need comma-separated numbers, got {text!r}") from exc
        if not values or min(values) < low:
            raise argparse.ArgumentTypeError(f"need comma-separated numbers >= {low:g}, got {text!r}")
        return values

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    description = (bench.mix.__doc__ or "").split("\n")[0]
    p = argparse.ArgumentParser(prog="python -m bench.mix", description=description)
    p.add_argument("--quick", action="store_true", help="a tenth of the data, fewer epochs and rounds")
    default_sizes = ",".join(str(s.num_samples) for s in data.SOURCES)
    p.add_argument("--sizes", type=_values(int, 16), help=f"samples per source (default {default_sizes})")
    p.add_argument("--weights", type=_values(float, 1e-9), help="weight per source (default 0.5,0.3,0.2)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, help="epochs per contender and world (default 20, --quick 4)")
    p.add_argument("--worlds", type=_values(int, 1), default=[1, 2, 4], help="simulated world sizes")
    p.add_argument(
        "--window", type=int, default=DEFAULT_SHUFFLE_BUFFER, help="samples per scored shuffle window"
    )
    p.add_argument(
        "--contenders",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        default=list(contenders.NAMES),
        help=f"comma-separated, of {','.join(contenders.NAMES)} (default all)",
    )
    p.add_argument("--repeats", type=int, help="speed rounds (default 5, --quick 2)")
    p.add_argument("--warmup", type=int, default=5, help="batches per loader before the speed clock starts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench-results") / "mix")
    p.add_argument("--cache", type=Path, default=Path("bench-results") / "cache", help="the sources' data")
    p.add_argument("--docs", type=Path, help="write this run's section (bench-mix) of this Markdown page too")
    args = p.parse_args(argv)
    args.sizes = args.sizes or list(data.QUICK_SIZES if args.quick else (s.num_samples for s in data.SOURCES))
    args.weights = args.weights or [s.weight for s in data.SOURCES]
    args.epochs = args.epochs or (4 if args.quick else 20)
    args.repeats = args.repeats or (2 if args.quick else 5)
    for name in ("batch_size", "workers", "epochs", "window", "repeats", "warmup"):
        least = 0 if name == "workers" else 1
        if getattr(args, name) < least:
            p.error(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    unknown = sorted(set(args.contenders) - set(contenders.NAMES))
    if unknown or not args.contenders:
        p.error(f"--contenders: choose from {', '.join(contenders.NAMES)}, got {args.contenders}")
    try:
        data.specs(args.sizes, args.weights)
    except ValueError as exc:
        p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    specs = data.specs(args.sizes, args.weights)
    twins = data.prepare(specs, args.cache, twin=True, workers=max(args.workers, 1))
    full = data.prepare(specs, args.cache, twin=False, workers=max(args.workers, 1))
    settings = contenders.Settings(args.batch_size, args.workers, args.epochs, args.seed)
    print(f"composition: {args.epochs} epochs per contender and world size, on the count twins", flush=True)
    results, twin_first = run.composition(args.contenders, twins, args.worlds, settings, args.window)
    print(f"speed: {args.repeats} rounds of the mixture and the sources alone, full size", flush=True)
    speed, raw, full_first = run.speed(full, settings, args.repeats, args.warmup)
    same = None if twin_first is None or not full_first else twin_first == full_first
    found = report.targets(results, speed, same)
    meta, record_run = run_record(args, argv, started, specs, full, speed, raw, same)
    record = {**meta, "targets": found, "results": results}
    chart = Chart("mix.png", lambda path: report.chart(path, results, speed), CAPTION)
    docs = None
    if args.docs is not None:
        lines = report.result_lines(meta, results, found, "####")
        settings_shown = {"sources": meta["sources"], "twin payload bytes": data.TWIN_BYTES}
        docs = DocsSection(
            args.docs,
            "bench-mix",
            "training on a mixture",
            {**RULES, "spread": SPREAD},
            lines,
            settings_shown,
        )
    print(report.table(results), "", *report.target_lines(found), sep="\n")
    markdown = report.markdown(meta, results, found)
    written = write_report(args.out, record_run, record, markdown, charts=[chart], docs=docs)
    print("wrote", ", ".join(map(str, written)))
    return 0


def run_record(
    args: argparse.Namespace,
    argv: list[str] | None,
    started: float,
    specs: tuple[data.SourceSpec, ...],
    full: tuple[data.Source, ...],
    speed: dict[str, list[float]],
    raw: dict[str, Any],
    same: bool | None,
) -> tuple[dict[str, Any], Run]:
    """What the report records beside the results: the run, the sources, the speed rounds, the rules."""
    record_run = Run.of("bench.mix", argv, args)
    sources = [
        {**asdict(s), "fingerprint": f.data.profile.fingerprint} for s, f in zip(specs, full, strict=True)
    ]
    meta: dict[str, Any] = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": round(time.perf_counter() - started, 1),
        "hardware": record_run.machine,
        "versions": record_run.versions,
        "sources": sources,
        "epochs": args.epochs,
        "parameters": record_run.parameters,
        "speed": speed,
        "speed_raw": raw,
        "twins_match": same,
        "rules": RULES,
    }
    return meta, record_run


if __name__ == "__main__":
    sys.exit(main())
