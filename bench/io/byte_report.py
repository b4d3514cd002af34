"""The byte profiles' report (a :class:`bench.io.report.Kind`): rows per (profile, cache), each contender's
MB/s against the physical floor and the in-memory ceiling, and for ``--remote`` the bytes fetched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.common import system
from bench.common.tables import markdown_table
from bench.io import report
from bench.io.report import Meta, Results
from bench.io.run import Run, summarize

FIGURE = "throughput.png"
IN_MEMORY_NOTE = (
    "in-memory: Python dicts collated one by one by a plain DataLoader;\n"
    "shardpipe builds each batch from columns, no dict per sample, so it can outrun it"
)
CAPTION = "payload MB/s per contender (median of repeats, bars min-max; orange: input-bound)"
RULES = {
    "step": "from asking the loader for a batch to asking for the next; data wait = time blocked in next()",
    "warmup": "the first --warmup steps of every run are discarded (worker start, first shuffle windows)",
    "first_batch": "wait of the first step, from iter(loader) (worker start included) to the first batch",
    "window": "the next --steps steps; throughput = samples in the window / the window's wall time",
    "repeats": "--repeats runs per contender, interleaved and rotated; median reported, min/max as spread",
    "mb_per_s": "samples/s x mean payload bytes per sample (the bin field), decimal MB",
    "verdict": "input-bound when the median wait fraction > --threshold, else compute-bound",
    "floor": f"one sequential pass over the tar shard files ({system.READ_CHUNK >> 20} MiB reads), as payload"
    " MB/s",
    "warm": "every file a contender reads is read once, front to back, before each of its warm runs",
    "cold": "files evicted with posix_fadvise(DONTNEED) before every run; see 'eviction' for whether it took",
    "peak_rss": "max over the run of the summed RSS of the main process and its workers (shared pages counted"
    " in each)",
}
COLUMNS = ("contender", "samples/s", "spread", "MB/s", "wait", "verdict", "1st batch", "x floor", "x in-mem")


def add_ratios(entries: Results, floor_mb_per_s: float) -> None:
    """Each entry's MB/s as a fraction of the physical floor and of the in-memory ceiling."""
    ceiling = next((e["mb_per_s"] for e in entries if e["contender"] == "in-memory"), None)
    for entry in entries:
        entry["floor_mb_per_s"] = floor_mb_per_s
        entry["fraction_of_floor"] = entry["mb_per_s"] / floor_mb_per_s
        entry["fraction_of_in_memory"] = entry["mb_per_s"] / ceiling if ceiling else None


def byte_entries(
    runs: dict[str, list[Run]], threshold: float, floor: dict[str, float], **group: Any
) -> list[dict[str, Any]]:
    """One group's entries: summaries with their ratios to the floor and to in-memory, and ``group``'s
    keys (profile, cache, ...) in each."""
    entries = [summarize(name, name_runs, threshold) for name, name_runs in runs.items()]
    add_ratios(entries, floor["payload_mb_per_s"])
    for entry in entries:
        entry.update(floor=floor, **group)
    return entries


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


def _panels(results: Results) -> list[tuple[str, Results]]:
    """The entries by (profile, cache), each group under its title."""
    groups: dict[tuple[str, str], Results] = {}
    for entry in results:
        groups.setdefault((entry["profile"], entry["cache"]), []).append(entry)
    panels = []
    for entries in groups.values():
        e = entries[0]
        title = (
            f"{e['profile']} profile (~{e['bytes_per_sample']:,.0f} B/sample), {e['cache']} cache; "
            f"floor {e['floor_mb_per_s']:,.0f} MB/s"
        )
        panels.append((title, entries))
    return panels


def _tables(results: Results, heading: str) -> list[str]:
    return report.tables([(t, [list(COLUMNS), *map(_row, e)]) for t, e in _panels(results)], heading)


def table(meta: Meta, results: Results) -> str:
    """Plain-text tables, one per (profile, cache)."""
    return "\n".join(_tables(results, ""))


def docs_results(meta: Meta, results: Results) -> list[str]:
    """The tables for docs/benchmarks.md, with the eviction check and, for ``--remote``, the bytes
    each contender fetched from the server."""
    lines = [*_tables(results, "####"), *report.targets_section(meta, "####")]
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


def markdown(meta: Meta, results: Results) -> str:
    body = [*_tables(results, "##"), *report.targets_section(meta, "##")]
    return report.markdown("shardpipe I/O benchmark", meta, body)


def chart(path: Path, meta: Meta, results: Results) -> None:
    report.chart(
        path,
        _panels(results),
        value="mb_per_s",
        xlabel="payload MB/s (median of repeats, bars: min-max)",
        note=lambda e: f"  {e['samples_per_s']:,.0f}/s, wait {e['wait_fraction']:.0%}",
        color=report.verdict_color,
        room=1.5,
        legend=report.verdict_legend(meta, results) + "\n" + IN_MEMORY_NOTE,
    )
