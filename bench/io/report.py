"""What a bench-io run reports: a terminal table, the text of ``report.md``, its plot and the tables of its
``--docs`` section, as every kind of run (:class:`Kind`) renders them (``bench.common.report`` writes them);
the rows of each kind are in ``bench.io.byte_report`` and ``bench.io.image_report``.

Ratios are taken within one group (a profile, and for bytes a cache state) of one run, so they hold on a
noisy machine; absolute numbers compare only on like hardware, batch size and data (all recorded in the
report).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import torch

from bench.common import system
from bench.common.report import measured_on
from bench.common.tables import aligned, markdown_table
from bench.io import targets
from bench.io.contenders import SEED, SHUFFLE_BUFFER, LoaderSettings

Meta = dict[str, Any]
Results = list[dict[str, Any]]


class Kind(Protocol):
    """What one kind of run writes: ``bench.io.byte_report`` (the byte profiles) and
    ``bench.io.image_report`` (the image profiles) are the two."""

    FIGURE: str  # the plot's file name in --out
    CAPTION: str  # the plot's caption in the docs page, after its section's name

    def table(self, meta: Meta, results: Results) -> str: ...

    def docs_results(self, meta: Meta, results: Results) -> list[str]: ...

    def markdown(self, meta: Meta, results: Results) -> str: ...

    def chart(self, path: Path, meta: Meta, results: Results) -> None: ...


def meta(
    args: argparse.Namespace,
    started: float,
    datasets: dict[str, Any],
    settings: LoaderSettings,
    rules: dict[str, str],
    **versions: str,
) -> Meta:
    """What makes a run's results comparable: when, where, what versions, data, parameters and rules."""
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": round(time.perf_counter() - started, 1),
        "hardware": system.hardware(),
        "versions": {**system.versions(), **versions},
        "datasets": datasets,
        "parameters": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "settings": {**asdict(settings), "shuffle_buffer": SHUFFLE_BUFFER, "seed": SEED},
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "rules": rules,
    }


def tables(panels: list[tuple[str, list[list[str]]]], heading: str) -> list[str]:
    """Titled tables (a title, then rows of cells, the header first): as Markdown under ``heading``-level
    titles, or, with ``heading=""``, as terminal text."""
    lines: list[str] = []
    for title, rows in panels:
        if heading:
            lines += [f"{heading} {title}", "", *markdown_table(rows), ""]
        else:
            lines += ["", title, *aligned(rows)]
    return lines


def targets_section(meta: Meta, heading: str) -> list[str]:
    """The run's targets under a ``heading``-level title (none when no target ran)."""
    return [f"{heading} Targets", "", *targets.markdown(meta["targets"])] if meta.get("targets") else []


def markdown(title: str, meta: Meta, body: list[str]) -> str:
    """``report.md``: the run in one line, ``body`` (the tables), then the rules, data and versions."""
    params = meta["parameters"]
    lines = [
        f"# {title}",
        "",
        f"{measured_on(meta['created'], meta['hardware'])}; device {meta['device']}; "
        f"batch {params['batch_size']}, {params['workers']} workers, compute {params['compute_ms']} ms/step, "
        f"{params['repeats']} repeat(s).",
        "",
        *body,
        "## Rules",
        "",
        *(f"- **{k}**: {v}" for k, v in meta["rules"].items()),
    ]
    if meta.get("eviction"):
        lines += ["", f"Eviction check: {json.dumps(meta['eviction'])}"]
    lines += ["", "## Data", "", "```json", json.dumps(meta["datasets"], indent=1), "```"]
    lines += ["", "## Versions", "", "```json", json.dumps(meta["versions"], indent=1), "```", ""]
    return "\n".join(lines)


def chart(
    path: Path,
    panels: list[tuple[str, Results]],
    *,
    value: str,
    xlabel: str,
    note: Callable[[dict[str, Any]], str],
    color: Callable[[dict[str, Any]], str],
    room: float,
    legend: str,
) -> None:
    """One horizontal bar panel per group: ``value`` with its min-max as error bars, ``note`` beside each
    bar, the x axis ``room`` times the largest max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(len(entries) for _, entries in panels)  # bars per panel: one per contender
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.2 + 0.45 * rows * len(panels)), squeeze=False)
    for ax, (title, entries) in zip(axes[:, 0], panels, strict=True):
        values = [e[value] for e in entries]
        errors = [
            [v - e[f"{value}_min"] for v, e in zip(values, entries, strict=True)],
            [e[f"{value}_max"] - v for v, e in zip(values, entries, strict=True)],
        ]
        ax.barh(
            [e["contender"] for e in entries], values, xerr=errors, color=list(map(color, entries)), capsize=3
        )
        ax.invert_yaxis()
        for i, e in enumerate(entries):  # right of the spread bar, so the label never overlaps it
            ax.text(e[f"{value}_max"], i, note(e), va="center", fontsize=8)
        ax.set_xlim(0, max(e[f"{value}_max"] for e in entries) * room)
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=10)
    fig.suptitle(legend, fontsize=9)
    lines = legend.count("\n") + 1  # room at the top for every line of the legend
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.011 * lines))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def verdict_color(entry: dict[str, Any]) -> str:
    return "tab:orange" if entry["verdict"] == "input-bound" else "tab:green"


def verdict_legend(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """What the bars' colours say: with no compute step every contender waits on its input (the chart
    compares read speed alone), so only a run that computes can show both verdicts."""
    if not meta["parameters"]["compute_ms"]:
        return "no compute step (--compute-ms 0): read speed alone, every contender input-bound (orange)"
    found = {e["verdict"] for e in results}
    if found == {"input-bound"}:
        return "orange: input-bound (every contender waits on its input at this compute time)"
    if found == {"compute-bound"}:
        return "green: compute-bound (no contender waits on its input at this compute time)"
    return "orange: input-bound, green: compute-bound"
