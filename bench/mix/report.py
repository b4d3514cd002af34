"""The mixture benchmark's outputs: the targets judged, a terminal table, ``report.md``'s text and
``mix.png`` (composition error per kind of run for every contender, and the read speed of each round)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench.common.report import measured_on
from bench.common.tables import aligned, markdown_table
from bench.mix.metrics import KINDS
from bench.mix.speed import PASSES

LABELS = {
    "shardpipe": "shardpipe Mixture",
    "shardpipe-per-batch": "shardpipe Mixture(per_batch=True)",
    "random-mix": "webdataset RandomMix",
    "weighted-draw": "weighted draw (numpy)",
}
"""Every contender, in table order, and how the tables name it."""
COMPOSITION_TARGET = 1.0  # samples per source
COMPOSITION_TARGETS = (
    *(("shardpipe", kind) for kind in ("epoch", "rank share", "worker part", "shuffle window")),
    ("shardpipe-per-batch", "batch"),
)
"""(contender, kind of run) whose composition error must be <= COMPOSITION_TARGET at every world size."""
REPEAT_CONTENDERS = ("shardpipe", "shardpipe-per-batch")
"""Contenders that must repeat no sample of a source before covering it."""
SPEED_TARGET = 0.9  # mixture samples/s over the sources read alone, median of the rounds' ratios
SPEED_COLUMNS = ("mixture samples/s", "sources alone", "ratio")


def _worst(results: list[dict[str, Any]], contender: str, kind: str) -> float | None:
    values = [e["errors"][kind] for e in results if e["contender"] == contender]
    return max(values) if values else None


def targets(
    results: list[dict[str, Any]], speed: dict[str, list[float]], twins: bool | None
) -> list[dict[str, Any]]:
    """The issue's targets, each with its measured value (shown as ``shown``) and whether it is met; a
    target whose contender did not run is left out."""
    found: list[dict[str, Any]] = []
    for contender, kind in COMPOSITION_TARGETS:
        value = _worst(results, contender, kind)
        if value is not None:
            found.append(
                {
                    "target": f"{LABELS[contender]}: composition error per {kind} <= {COMPOSITION_TARGET:g} "
                    "sample per source, at every world size",
                    "value": value,
                    "shown": f"{value:.3g}",
                    "threshold": COMPOSITION_TARGET,
                    "met": value <= COMPOSITION_TARGET,
                }
            )
    for contender in REPEAT_CONTENDERS:
        counts = [sum(e["repeats"]) for e in results if e["contender"] == contender]
        if counts:
            found.append(
                {
                    "target": f"{LABELS[contender]}: 0 repeats before a source is covered (at epoch ends), at"
                    " every world size",
                    "value": max(counts),
                    "shown": str(max(counts)),
                    "threshold": 0,
                    "met": max(counts) == 0,
                }
            )
    for suffix, when in PASSES:
        mixed, alone = speed.get("mixture" + suffix), speed.get("alone" + suffix)
        if not (mixed and alone):
            continue
        ratio = statistics.median(m / a for m, a in zip(mixed, alone, strict=True))
        found.append(
            {
                "target": f"mixture samples/s >= {SPEED_TARGET:g}x the sources read alone, {when} (paired "
                "rounds)",
                "value": ratio,
                "shown": f"{ratio:.3g}x",
                "threshold": SPEED_TARGET,
                "met": ratio >= SPEED_TARGET,
                "spread": f"rounds {min(mixed):,.0f}-{max(mixed):,.0f} vs "
                f"{min(alone):,.0f}-{max(alone):,.0f} samples/s",
            }
        )
    if twins is not None:
        found.append(
            {
                "target": "count twins: the full-size mixture's first epoch has the twins' source sequence",
                "value": twins,
                "shown": "same" if twins else "differs",
                "threshold": True,
                "met": twins,
            }
        )
    return found


def target_lines(found: list[dict[str, Any]]) -> list[str]:
    """One line per target: the verdict, the target, what was measured (and the spread, if any)."""
    lines = []
    for t in found:
        spread = f" ({t['spread']})" if "spread" in t else ""
        lines.append(f"{'MET    ' if t['met'] else 'NOT MET'}  {t['target']}: {t['shown']}{spread}")
    return lines


def _rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = [["contender", "world", *KINDS, "repeats", "in training order", "samples/epoch"]]
    for e in results:
        rows.append(
            [
                LABELS[e["contender"]],
                str(e["world_size"]),
                *(f"{e['errors'][kind]:.2f}" for kind in KINDS),
                "/".join(str(r) for r in e["repeats"]),
                "/".join(str(r) for r in e["repeats_in_order"]),
                f"{e['samples_per_epoch']:,.0f}",
            ]
        )
    return rows


def table(results: list[dict[str, Any]]) -> str:
    """Composition error (samples) per kind of run, repeats per source, one row per contender and world."""
    return "\n".join(aligned(_rows(results)))


def _speed_rows(speed: dict[str, list[float]]) -> list[list[str]]:
    passes = [(suffix, when) for suffix, when in PASSES if "mixture" + suffix in speed]
    rows = [["round"] + [f"{label}, {when}" for _, when in passes for label in SPEED_COLUMNS]]
    for i in range(len(speed.get("mixture", []))):
        row = [str(i + 1)]
        for suffix, _ in passes:
            m, a = speed["mixture" + suffix][i], speed["alone" + suffix][i]
            row += [f"{m:,.0f}", f"{a:,.0f}", f"{m / a:.3f}"]
        rows.append(row)
    return rows


def result_lines(
    meta: dict[str, Any], results: list[dict[str, Any]], found: list[dict[str, Any]], heading: str
) -> list[str]:
    """The targets, the composition table and the speed rounds, as Markdown under ``heading`` titles."""
    sources = ", ".join(
        f"{s['name']} {s['num_samples']:,} x {s['sample_bytes']:,} B {s['format']} (weight {s['weight']:g})"
        for s in meta["sources"]
    )
    intro = (
        f"Sources: {sources}. Composition error in samples, the worst over {meta['epochs']} epochs; repeats "
        "per source in that order, at epoch ends (judged) and in training order."
    )
    targets_part = [f"{heading} Targets", "", *(f"- {line}" for line in target_lines(found))]
    table_part = [f"{heading} Composition error and repeats", "", *markdown_table(_rows(results))]
    speed_part = [f"{heading} Speed rounds", "", *markdown_table(_speed_rows(meta["speed"]))]
    return [intro, "", *targets_part, "", *table_part, "", *speed_part]


def markdown(meta: dict[str, Any], results: list[dict[str, Any]], found: list[dict[str, Any]]) -> str:
    p = meta["parameters"]
    head = (
        f"{measured_on(meta['created'], meta['hardware'])}; batch {p['batch_size']}, {p['workers']} workers, "
        f"worlds {','.join(str(w) for w in p['worlds'])} (every rank planned in turn)."
    )
    rules = [f"- **{name}**: {rule}" for name, rule in meta["rules"].items()]
    versions = ["```json", json.dumps(meta["versions"], indent=1), "```"]
    body = result_lines(meta, results, found, "##")
    return "\n".join(["# shardpipe mixture benchmark", "", head, "", *body, "", "## Rules", "", *rules,
                      "", "## Versions", "", *versions, ""])  # fmt: skip


def chart(path: Path, results: list[dict[str, Any]], speed: dict[str, list[float]]) -> None:
    """Left: each contender's largest composition error per kind of run (symlog), the target at 1.
    Right: samples/s of the mixture and of the sources read alone, round by round, in each pass."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.4), gridspec_kw={"width_ratios": [2.2, 1]})
    contenders = [c for c in LABELS if any(e["contender"] == c for e in results)]
    width = 0.8 / max(len(contenders), 1)
    for i, contender in enumerate(contenders):
        values = [_worst(results, contender, kind) or 0.0 for kind in KINDS]
        left.bar([k + (i - (len(contenders) - 1) / 2) * width for k in range(len(KINDS))], values, width,
                 label=LABELS[contender])  # fmt: skip
    left.axhline(COMPOSITION_TARGET, color="black", linestyle=":", label="target (1 sample)")
    left.set_yscale("symlog", linthresh=1)
    left.set_xticks(range(len(KINDS)), KINDS)
    left.set_ylabel("largest |count - weight x n| (samples)")
    left.set_title("composition error, worst over epochs and world sizes", fontsize=10)
    left.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    for suffix, when in PASSES:
        for name, color in (("mixture", "tab:blue"), ("alone", "tab:orange")):
            runs = speed.get(name + suffix, [])
            label = f"{'mixture' if name == 'mixture' else 'sources alone'}, {when}"
            style, alpha = ("o-", 1.0) if suffix else ("s:", 0.6)  # the next epoch solid, the first dotted
            right.plot(range(1, len(runs) + 1), runs, style, color=color, label=label, alpha=alpha)
    right.set_xticks(range(1, len(speed.get("mixture", [])) + 1))
    right.set_xlabel("round")
    right.set_ylabel("samples/s (warm cache)")
    right.set_ylim(bottom=0)
    right.set_title("read speed, rounds interleaved", fontsize=10)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
