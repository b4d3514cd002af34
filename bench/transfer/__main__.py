"""``python -m bench.transfer``: run every transport interleaved, time the components, write the report."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.common.report import Chart, DocsSection, Run, measured_on, write_report
from bench.common.tables import aligned, markdown_table
from bench.transfer import RULES
from bench.transfer.measure import PIPE_BYTES, PREFETCH, RING_SLOTS, TRANSPORTS, components, run_once

TITLE = "moving batches from workers to the trainer"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.transfer", description="where a batch's cost goes between worker and trainer"
    )
    p.add_argument("--quick", action="store_true", help="fewer batches and repeats (< 1 min)")
    p.add_argument("--sizes", default="1024,65536", help="mean sample bytes, comma-separated")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--bytes-per-run", type=int, help="payload per run (default 512 MB, --quick 64 MB)")
    p.add_argument("--repeats", type=int, help="interleaved runs per transport (default 7, --quick 5)")
    p.add_argument("--warmup", type=int, default=10, help="batches per run before the clock starts")
    p.add_argument("--calls", type=int, help="calls per component timing (default 300, --quick 50)")
    p.add_argument("--out", type=Path, default=Path("bench-results") / "transfer")
    p.add_argument(
        "--docs",
        type=Path,
        help="also write this run's section of this Markdown page (make bench-transfer: docs/benchmarks.md)",
    )
    args = p.parse_args(argv)
    args.sizes = [int(v) for v in args.sizes.split(",") if v]
    args.bytes_per_run = args.bytes_per_run or (64 if args.quick else 512) * 10**6
    args.repeats = args.repeats or (5 if args.quick else 7)
    args.calls = args.calls or (50 if args.quick else 300)
    for name in ("batch_size", "workers", "bytes_per_run", "repeats", "warmup", "calls"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.sizes or min(args.sizes) < 16:
        p.error(f"--sizes must be integers >= 16, got {args.sizes}")
    return args


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for size in args.sizes:
        batches = max(args.bytes_per_run // (size * args.batch_size), 50)
        runs: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
        for repeat in range(args.repeats):
            for transport in TRANSPORTS[repeat % len(TRANSPORTS) :] + TRANSPORTS[: repeat % len(TRANSPORTS)]:
                runs[transport].append(
                    run_once(transport, args.batch_size, size, batches, args.warmup, args.workers)
                )
                print(
                    f"  {size:>6} B #{repeat + 1} {transport:9} {runs[transport][-1]:9,.0f} batches/s",
                    flush=True,
                )
        parts = components(args.batch_size, size, args.calls)
        reference = statistics.median(runs["pipe-1m"])
        for transport in TRANSPORTS:
            median = statistics.median(runs[transport])
            results.append(
                {
                    "sample_bytes": size,
                    "transport": transport,
                    "batches_per_run": batches,
                    "batches_per_s": median,
                    "batches_per_s_min": min(runs[transport]),
                    "batches_per_s_max": max(runs[transport]),
                    "runs": runs[transport],
                    "mb_per_s": median * size * args.batch_size / 1e6 if transport != "floor" else None,
                    "main_us_per_batch": 1e6 / median,
                    "vs_pipe_1m": median / reference,
                    "components": parts,
                }
            )
    return results


def chart(path: Path, results: list[dict[str, Any]]) -> None:
    """The trainer's time per batch against the sample size, one line per transport (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for transport in dict.fromkeys(e["transport"] for e in results):
        points = sorted((e for e in results if e["transport"] == transport), key=lambda e: e["sample_bytes"])
        style = ":" if transport == "floor" else "o-"
        label = "floor (the DataLoader round trip alone)" if transport == "floor" else transport
        ax.plot(
            [e["sample_bytes"] for e in points], [e["main_us_per_batch"] for e in points], style, label=label
        )
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    sizes = sorted({e["sample_bytes"] for e in results})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes, [f"{size:,} B" for size in sizes])
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("sample bytes (batch of a fixed sample count)")
    ax.set_ylabel("trainer us per batch (median; lower is better)")
    ax.legend(fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def recommendation(results: list[dict[str, Any]]) -> list[str]:
    """Per sample size: does the ring beat the enlarged pipe, and how much of the pipe's per-batch time is
    the fixed DataLoader round trip (``floor``) that neither transport removes."""
    lines = []
    for entry in (e for e in results if e["transport"] == "ring"):
        ratio, size = entry["vs_pipe_1m"], entry["sample_bytes"]
        same = {e["transport"]: e for e in results if e["sample_bytes"] == size}
        verdict = "beats" if ratio > 1.05 else "loses to" if ratio < 0.95 else "ties with (within 5%)"
        lines.append(
            f"{size:,} B samples: the ring {verdict} the 1 MiB pipe: {ratio:.2f}x its batches/s; per batch "
            f"the pipe takes {same['pipe-1m']['main_us_per_batch']:,.0f} us, the ring "
            f"{entry['main_us_per_batch']:,.0f}, the fixed round trip "
            f"{same['floor']['main_us_per_batch']:,.0f}"
        )
    return lines


def table(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = [
        [
            "sample B",
            "transport",
            "batches/s",
            "spread",
            "MB/s",
            "main us/batch",
            "x pipe-1m",
            "pickle us",
            "unpickle us",
            "ring write us",
            "ring read us",
            "ring view us",
            "pickled B",
        ]
    ]
    for e in results:
        c = e["components"]
        rows.append(
            [
                f"{e['sample_bytes']:,}",
                e["transport"],
                f"{e['batches_per_s']:,.0f}",
                f"{e['batches_per_s_min']:,.0f}-{e['batches_per_s_max']:,.0f}",
                "-" if e["mb_per_s"] is None else f"{e['mb_per_s']:,.0f}",
                f"{e['main_us_per_batch']:,.0f}",
                f"{e['vs_pipe_1m']:.2f}",
                f"{c['pickle_us']:,.0f}",
                f"{c['unpickle_us']:,.0f}",
                f"{c['ring_write_us']:,.0f}",
                f"{c['ring_read_us']:,.0f}",
                f"{c['ring_view_us']:,.0f}",
                f"{c['pickled_bytes']:,}",
            ]
        )
    return rows


def markdown(meta: dict[str, Any], args: argparse.Namespace, lines: list[str]) -> str:
    """report.md: the machine and the run's shape, then the table and the recommendation."""
    head = [
        "# shardpipe transfer benchmark",
        "",
        f"{measured_on(meta['created'], meta['hardware'])}; batch {args.batch_size}, {args.workers} workers, "
        f"{args.repeats} interleaved repeats.",
        "",
    ]
    return "\n".join([*head, *lines, "", "Method: see the docstring of bench/transfer/__init__.py.", ""])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    results = measure(args)
    advice = recommendation(results)
    run = Run.of("bench.transfer", argv, args)
    meta: dict[str, Any] = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "hardware": run.machine,
        "versions": run.versions,
        "parameters": run.parameters,
        "prefetch_factor": PREFETCH,
        "ring_slots": RING_SLOTS,
        "pipe_bytes": PIPE_BYTES,
    }
    rows = table(results)
    lines = [*markdown_table(rows), "", *[f"- {line}" for line in advice]]
    docs = None
    if args.docs:
        settings = {k: meta[k] for k in ("prefetch_factor", "ring_slots", "pipe_bytes")}
        docs = DocsSection(args.docs, "bench-transfer", TITLE, RULES, lines, settings)
    record = {**meta, "results": results, "recommendation": advice}
    figure = Chart("transfer.png", lambda path: chart(path, results), "trainer us per batch, by transport")
    paths = write_report(args.out, run, record, markdown(meta, args, lines), charts=[figure], docs=docs)
    print("\n".join(["", *aligned(rows), "", *advice]))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
