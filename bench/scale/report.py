"""bench-scale's targets, tables and plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.tables import markdown_table

FIRST_WINDOW_S = 0.050
PEAK_MB = 32.0
FLAT = 2.0
FIRST_BATCH_S = 1.0
RSS_GROWTH_MB = 64.0
MANIFEST_SHARDS = 10**6
MANIFEST_LOAD_S = 0.5
MANIFEST_MB = 64.0


def _kind(entry: dict[str, Any]) -> str:
    return "dataset" if entry["sources"] == 1 else f"mixture of {entry['sources']}"


def targets(
    results: Sequence[dict[str, Any]], end_to_end: Sequence[dict[str, Any]], loads: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each target with what was measured and whether it holds."""
    ours = [e for e in results if e["contender"] == "layout-3"]
    found = []
    if ours:
        slowest = max(ours, key=lambda e: e["first_window_s"])
        largest = max(ours, key=lambda e: e["peak_mb"])
        found += [
            _target(f"plan-only first window <= {FIRST_WINDOW_S * 1e3:.0f} ms, every case",
                    f"{slowest['first_window_s'] * 1e3:.1f} ms at most ({slowest['label']})",
                    slowest["first_window_s"] <= FIRST_WINDOW_S),
            _target(f"plan-only peak memory <= {PEAK_MB:.0f} MB above the shard table, every case",
                    f"{largest['peak_mb']:.1f} MB at most ({largest['label']})",
                    largest["peak_mb"] <= PEAK_MB),
        ]  # fmt: skip
        groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for entry in ours:
            groups.setdefault((entry["sources"], entry["world"]), []).append(entry)
        time_ratio = max(_spread([e["first_window_s"] for e in g]) for g in groups.values())
        found.append(_target(f"time flat in N within {FLAT:g}x (per kind and world)",
                             f"{time_ratio:.2f}x at most", time_ratio <= FLAT))  # fmt: skip
    by_samples = {e["samples"]: e for e in end_to_end}
    if 10**8 in by_samples and 10**6 in by_samples:
        large, small = by_samples[10**8], by_samples[10**6]
        growth = large["worker_peak_rss_mb"] - small["worker_peak_rss_mb"]
        found += [
            _target(f"end to end, samples_per_epoch=10^8: first batch <= {FIRST_BATCH_S:g} s",
                    f"{large['first_batch_s']:.2f} s with the worker's start ({small['first_batch_s']:.2f} s "
                    f"at 10^6); the next epoch's {large['next_epoch_first_batch_s']:.2f} s",
                    large["first_batch_s"] <= FIRST_BATCH_S),
            _target(f"end to end: worker RSS at 10^8 within {RSS_GROWTH_MB:.0f} MB of 10^6",
                    f"{growth:+.0f} MB", growth <= RSS_GROWTH_MB),
        ]  # fmt: skip
    for load in loads:
        if load["shards"] == MANIFEST_SHARDS and load["form"] == "table file":
            found.append(_target(
                f"manifest of 10^6 shards: loaded in <= {MANIFEST_LOAD_S:g} s, <= {MANIFEST_MB:.0f} MB",
                f"{load['load_s']:.2f} s to load, {load['dataset_first_window_s']:.2f} s to a dataset's "
                f"first window, peak RSS +{load['peak_rss_growth_mb']:.0f} MB",
                load["load_s"] <= MANIFEST_LOAD_S and load["peak_rss_growth_mb"] <= MANIFEST_MB,
            ))  # fmt: skip
    return found


def _spread(values: Sequence[float]) -> float:
    return max(values) / max(min(values), 1e-9)


def _target(name: str, measured: str, met: bool) -> dict[str, Any]:
    return {"target": name, "measured": measured, "met": bool(met)}


def _cell(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    return f"{entry['first_window_s'] * 1e3:,.1f} ms, {entry['peak_mb']:,.1f} MB"


def plan_table(results: Sequence[dict[str, Any]], world: int) -> list[str]:
    samples = sorted({e["samples"] for e in results})
    rows = [["plan", "kind", *(f"N = 1e{round(np.log10(n))}" for n in samples)]]
    keys = sorted({(e["contender"], e["sources"]) for e in results if e["world"] == world},
                  key=lambda k: (k[1], k[0]))  # fmt: skip
    for contender, sources in keys:
        mine = [
            e for e in results if (e["world"], e["contender"], e["sources"]) == (world, contender, sources)
        ]
        cells = {e["samples"]: e for e in mine}
        kind = "dataset" if sources == 1 else f"mixture of {sources}"
        rows.append([contender, kind, *(_cell(cells.get(n)) for n in samples)])
    return markdown_table(rows)


def result_lines(
    results: Sequence[dict[str, Any]],
    end_to_end: Sequence[dict[str, Any]],
    loads: Sequence[dict[str, Any]],
    found: Sequence[dict[str, Any]],
) -> list[str]:
    lines = []
    for world in sorted({e["world"] for e in results}):
        lines += [f"#### Plan only, world {world}: time to the last worker's first window, peak memory", ""]
        lines += [*plan_table(results, world), ""]
    if end_to_end:
        rows = [["samples_per_epoch", "first batch (worker start included)", "next epoch's first batch",
                 "worker peak RSS"]]  # fmt: skip
        rows += [
            [f"{e['samples']:.0e}", f"{e['first_batch_s']:.2f} s", f"{e['next_epoch_first_batch_s']:.2f} s",
             f"{e['worker_peak_rss_mb']:.0f} MB"]
            for e in end_to_end
        ]  # fmt: skip
        lines += [
            "#### End to end: a Mixture of three packs, world 8 (last rank), one worker",
            "",
            *markdown_table(rows),
            "",
        ]
    if loads:
        rows = [
            ["shards", "shards kept", "files", "load", "a dataset to its first window", "peak RSS growth"]
        ]
        rows += [
            [f"{e['shards']:.0e}", e["form"], f"{e['files_mb']:,.1f} MB", f"{e['load_s']:.3f} s",
             f"{e['dataset_first_window_s']:.3f} s", f"{e['peak_rss_growth_mb']:,.0f} MB"]
            for e in loads
        ]  # fmt: skip
        lines += ["#### Manifests: one cold process loads the manifest, then builds a dataset over it", ""]
        lines += [*markdown_table(rows), ""]
    lines += ["#### Targets", ""]
    lines += [f"- {'met' if t['met'] else 'MISSED'}: {t['target']}: {t['measured']}" for t in found]
    return lines


def chart(path: Path, results: Sequence[dict[str, Any]]) -> None:
    """Time to the first window (left) and peak memory (right) against N, world 8, one line a plan."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    world = min(e["world"] for e in results)
    keys = sorted({(e["contender"], e["sources"]) for e in results}, key=lambda k: (k[1], k[0]))
    for contender, sources in keys:
        mine = sorted((e for e in results if e["world"] == world and e["contender"] == contender
                       and e["sources"] == sources), key=lambda e: e["samples"])  # fmt: skip
        if not mine:
            continue
        label = f"{contender}, {_kind(mine[0])}"
        style = "o-" if contender == "layout-3" else "s--"
        xs = [e["samples"] for e in mine]
        left.plot(xs, [e["first_window_s"] for e in mine], style, label=label)
        right.plot(xs, [e["peak_mb"] for e in mine], style, label=label)
    left.axhline(FIRST_WINDOW_S, color="black", linestyle=":", label="target")
    right.axhline(PEAK_MB, color="black", linestyle=":", label="target")
    for axis, name in ((left, "seconds to the first window"), (right, "peak traced MB")):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("samples per epoch")
        axis.set_ylabel(name)
        axis.set_title(f"world {world}, last rank's last worker", fontsize=10)
    left.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
