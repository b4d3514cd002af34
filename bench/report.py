"""The benchmark's outputs: a terminal table, ``report.json``, ``report.md`` and ``throughput.png``, and the
tables of its ``--docs`` section (``bench.docs_page``).

Ratios are taken within one (profile, cache) group of one run, so they hold on a noisy machine; absolute
numbers compare only on like hardware, batch size and data (all recorded in the report).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.targets import markdown as targets_markdown

RULES = {
    "step": "from asking the loader for a batch to asking for the next; data wait = time blocked in next()",
    "warmup": "the first --warmup steps of every run are discarded (worker start, first shuffle windows)",
    "first_batch": "wait of the first step, from iter(loader) (worker start included) to the first batch",
    "window": "the next --steps steps; throughput = samples in the window / the window's wall time",
    "repeats": "--repeats runs per contender, interleaved and rotated; median reported, min/max as spread",
    "mb_per_s": "samples/s x mean payload bytes per sample (the bin field), decimal MB",
    "verdict": "input-bound when the median wait fraction > --threshold, else compute-bound",
    "floor": "one sequential pass over the tar shard files (8 MiB reads), as payload MB/s",
    "warm": "every file a contender reads is read once, front to back, before each of its warm runs",
    "cold": "files evicted with posix_fadvise(DONTNEED) before every run; see 'eviction' for whether it took",
    "peak_rss": "max over the run of the summed RSS of the main process and its workers (shared pages counted"
    " in each)",
}
COLUMNS = ("contender", "samples/s", "spread", "MB/s", "wait", "verdict", "1st batch", "x floor", "x in-mem")


def add_ratios(entries: list[dict[str, Any]], floor_mb_per_s: float) -> None:
    """Each entry's MB/s as a fraction of the physical floor and of the in-memory ceiling."""
    ceiling = next((e["mb_per_s"] for e in entries if e["contender"] == "in-memory"), None)
    for entry in entries:
        entry["floor_mb_per_s"] = floor_mb_per_s
        entry["fraction_of_floor"] = entry["mb_per_s"] / floor_mb_per_s
        entry["fraction_of_in_memory"] = entry["mb_per_s"] / ceiling if ceiling else None


def _row(e: dict[str, Any]) -> list[str]:
    memory = e["fraction_of_in_memory"]
    return [
        e["contender"],
        f"{e['samples_per_s']:,.0f}",
        f"{e['samples_per_s_min']:,.0f}-{e['samples_per_s_max']:,.0f}",
        f"{e['mb_per_s']:,.1f}",
        f"{e['wait_fraction']:.0%}",
        e["verdict"],
        f"{e['first_batch_s']:.2f} s",
        f"{e['fraction_of_floor']:.3f}",
        "-" if memory is None else f"{memory:.2f}",
    ]


def _groups(results: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for entry in results:
        groups.setdefault((entry["profile"], entry["cache"]), []).append(entry)
    return groups


def _title(entries: list[dict[str, Any]]) -> str:
    e = entries[0]
    return (
        f"{e['profile']} profile (~{e['bytes_per_sample']:,.0f} B/sample), {e['cache']} cache; "
        f"floor {e['floor_mb_per_s']:,.0f} MB/s"
    )


def aligned(rows: list[list[str]]) -> list[str]:
    """Rows of cells as text lines: first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]


def markdown_table(rows: list[list[str]]) -> list[str]:
    """Rows of cells (the first is the header) as Markdown table lines."""
    return ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])] + [
        "| " + " | ".join(r) + " |" for r in rows[1:]
    ]


def table(results: list[dict[str, Any]]) -> str:
    """Plain-text tables, one per (profile, cache)."""
    lines: list[str] = []
    for entries in _groups(results).values():
        rows = [list(COLUMNS), *(_row(e) for e in entries)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
        lines += ["", _title(entries)]
        lines += [
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows
        ]
    return "\n".join(lines)


def group_tables(results: list[dict[str, Any]], heading: str) -> list[str]:
    """One Markdown table per (profile, cache), each under a ``heading``-level title."""
    lines: list[str] = []
    for entries in _groups(results).values():
        lines += [f"{heading} {_title(entries)}", "", *markdown_table([list(COLUMNS), *map(_row, entries)])]
        lines.append("")
    return lines


def docs_results(meta: dict[str, Any], results: list[dict[str, Any]]) -> list[str]:
    """The tables for docs/benchmarks.md, with the eviction check and, for ``--remote``, the bytes
    each contender fetched from the server."""
    lines = group_tables(results, "####")
    if meta.get("targets"):
        lines += ["#### Targets", "", *targets_markdown(meta["targets"])]
    remote = [e for e in results if "fetched_mb" in e]
    if remote:
        rows = [["contender", "fetched per run, MB (min-max)"]]
        rows += [[e["contender"], f"{min(e['fetched_mb']):,.1f}-{max(e['fetched_mb']):,.1f}"] for e in remote]
        first = remote[0]
        lines += [
            f"Loopback S3 server: {first['latency_ms']:g} ms per request, "
            f"{first['bandwidth_mb']:g} MB/s per response (0: no cap).",
            "",
            *markdown_table(rows),
            "",
        ]
    if meta["eviction"]:
        lines += [f"Eviction check: `{json.dumps(meta['eviction'])}`", ""]
    return lines


def markdown(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    hw, params = meta["hardware"], meta["parameters"]
    lines = [
        "# shardpipe I/O benchmark",
        "",
        f"{meta['created']} on {hw['cpu']} ({hw['cores_usable']} usable cores, {hw['ram_gib']} GiB RAM, "
        f"GPU: {hw['gpu'] or 'none'}); device {meta['device']}; batch {params['batch_size']}, "
        f"{params['workers']} workers, compute {params['compute_ms']} ms/step, "
        f"{params['repeats']} repeat(s).",
        "",
    ]
    lines += group_tables(results, "##")
    if meta.get("targets"):
        lines += ["## Targets", "", *targets_markdown(meta["targets"])]
    lines += ["## Rules", ""] + [f"- **{k}**: {v}" for k, v in meta["rules"].items()]
    if meta["eviction"]:
        lines += ["", f"Eviction check: {json.dumps(meta['eviction'])}"]
    lines += ["", "## Data", "", "```json", json.dumps(meta["datasets"], indent=1), "```"]
    lines += ["", "## Versions", "", "```json", json.dumps(meta["versions"], indent=1), "```", ""]
    return "\n".join(lines)


def chart(path: Path, results: list[dict[str, Any]]) -> None:
    """One horizontal bar panel per (profile, cache): MB/s with min-max error bars, wait fraction noted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _groups(results)
    rows = max(len(entries) for entries in groups.values())  # bars per panel: one per contender
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 2.2 + 0.45 * rows * len(groups)), squeeze=False)
    for ax, entries in zip(axes[:, 0], groups.values(), strict=True):
        names = [e["contender"] for e in entries]
        values = [e["mb_per_s"] for e in entries]
        errors = [
            [v - e["mb_per_s_min"] for v, e in zip(values, entries, strict=True)],
            [e["mb_per_s_max"] - v for v, e in zip(values, entries, strict=True)],
        ]
        colors = ["tab:orange" if e["verdict"] == "input-bound" else "tab:green" for e in entries]
        ax.barh(names, values, xerr=errors, color=colors, capsize=3)
        ax.invert_yaxis()
        for i, e in enumerate(entries):
            ax.text(
                e["mb_per_s_max"],  # right of the spread bar, so the label never overlaps it
                i,
                f"  {e['samples_per_s']:,.0f}/s, wait {e['wait_fraction']:.0%}",
                va="center",
                fontsize=8,
            )
        ax.set_xlim(0, max(e["mb_per_s_max"] for e in entries) * 1.5)
        ax.set_xlabel("payload MB/s (median of repeats, bars: min-max)")
        ax.set_title(_title(entries), fontsize=10)
    fig.suptitle("orange: input-bound, green: compute-bound", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: Path, meta: dict[str, Any], results: list[dict[str, Any]]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.json", out / "report.md", out / "throughput.png"]
    paths[0].write_text(json.dumps({**meta, "results": results}, indent=1) + "\n")
    paths[1].write_text(markdown(meta, results))
    chart(paths[2], results)
    return paths
