"""The shuffle benchmark's outputs: targets judged, a terminal table, ``report.json``, ``report.md`` and
``quality.png`` (mixing quality and read speed against the samples the shuffle holds per worker)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench.common.report import measured_on
from bench.common.tables import aligned, markdown_table

COLUMNS = (
    "contender",
    "buffer",
    "block",
    "memory",
    "classes",
    "x ideal",
    "entropy",
    "abs rho",
    "same shard x chance",
    "epoch corr",
    "samples/s",
    "once",
)
SORTED_TARGET, HASHED_TARGET, SPEED_TARGET, OLD_BUFFER = 0.9, 0.97, 0.9, 1024


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _row(e: dict[str, Any]) -> list[str]:
    return [
        e["label"] + (" *" if e["is_default"] else ""),
        _fmt(e["shuffle_buffer"], "d"),
        _fmt(e["block_size"], "d"),
        f"{e['memory_samples']:,}",
        f"{e['classes_per_batch']:.1f}",
        f"{e['classes_ratio']:.2f}",
        f"{e['entropy_bits']:.2f}",
        f"{e['spearman_abs']:.3f}",
        f"{e['same_shard_ratio']:.1f}",
        _fmt(e["epoch_correlation"], ".3f"),
        f"{e['samples_per_s']:,.0f}",
        "yes" if e["exactly_once"] else "NO",
    ]


def targets(results: list[dict[str, Any]], speed: dict[str, dict[str, list[float]]]) -> list[dict[str, Any]]:
    """The issue's targets, each with its measured value and whether it is met."""
    found: list[dict[str, Any]] = []
    defaults = {e["pack"]: e for e in results if e["is_default"]}
    for pack, threshold in (("sorted", SORTED_TARGET), ("hashed", HASHED_TARGET)):
        if pack in defaults:
            value = defaults[pack]["classes_ratio"]
            found.append(
                {
                    "target": f"{pack} pack, defaults: classes per batch >= {threshold}x ideal",
                    "value": value,
                    "threshold": threshold,
                    "met": value >= threshold,
                }
            )
    for pack, pair in speed.items():
        value = statistics.median(pair["default"]) / statistics.median(pair["reference"])
        found.append(
            {
                "target": f"{pack} pack: read samples/s at the defaults >= {SPEED_TARGET}x"
                " the reference (block 256, buffer 1024), side by side",
                "value": value,
                "threshold": SPEED_TARGET,
                "met": value >= SPEED_TARGET,
                "spread": f"runs {min(pair['default']):,.0f}-{max(pair['default']):,.0f} vs "
                f"{min(pair['reference']):,.0f}-{max(pair['reference']):,.0f} samples/s",
            }
        )
    memory = max((e["memory_samples"] for e in defaults.values()), default=None)
    if memory is not None:
        found.append(
            {
                "target": f"memory per worker at the defaults <= {OLD_BUFFER} samples (the old window)",
                "value": memory,
                "threshold": OLD_BUFFER,
                "met": memory <= OLD_BUFFER,
            }
        )
    return found


def target_lines(found: list[dict[str, Any]]) -> list[str]:
    return [
        f"{'MET    ' if t['met'] else 'NOT MET'}  {t['target']}: {t['value']:.4g}"
        + (f" ({t['spread']})" if "spread" in t else "")
        for t in found
    ]


def table(results: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    for pack in dict.fromkeys(e["pack"] for e in results):
        entries = [e for e in results if e["pack"] == pack]
        lines += ["", _title(entries[0]), *aligned([list(COLUMNS), *(_row(e) for e in entries)])]
    return "\n".join(lines)


def _title(e: dict[str, Any]) -> str:
    return (
        f"{e['pack']} pack: ideal {e['ideal_classes']:.1f} classes / batch, "
        f"entropy {e['ideal_entropy_bits']:.2f} bits, "
        f"chance same shard {e['chance_same_shard']:.4f}"
    )


def result_lines(
    meta: dict[str, Any], results: list[dict[str, Any]], found: list[dict[str, Any]], heading: str
) -> list[str]:
    """The targets, one table per pack and the speed pairs, as Markdown under ``heading``-level titles."""
    lines = [f"{heading} Targets", "", *[f"- {line}" for line in target_lines(found)], ""]
    for pack in dict.fromkeys(e["pack"] for e in results):
        entries = [e for e in results if e["pack"] == pack]
        table = markdown_table([list(COLUMNS), *map(_row, entries)])
        lines += [f"{heading} {_title(entries[0])}", "", *table, ""]
    return [
        *lines,
        f"{heading} Speed pairs (samples/s, interleaved repeats)",
        "",
        "```json",
        json.dumps(meta["speed"]),
        "```",
    ]


def markdown(meta: dict[str, Any], results: list[dict[str, Any]], found: list[dict[str, Any]]) -> str:
    p = meta["parameters"]
    lines = [
        "# shardpipe shuffle benchmark",
        "",
        f"{measured_on(meta['created'], meta['hardware'])}; "
        f"{p['classes']} classes x {p['per_class']} samples, {meta['num_shards']} shards per pack, batch "
        f"{p['batch_size']}, {p['workers']} workers, one rank, {p['epochs']} epochs per contender. "
        f"* = shardpipe's defaults ({meta['defaults']}).",
        "",
        *result_lines(meta, results, found, "##"),
    ]
    lines += ["", "## Rules", "", *[f"- **{k}**: {v}" for k, v in meta["rules"].items()]]
    lines += ["", "## Versions", "", "```json", json.dumps(meta["versions"], indent=1), "```", ""]
    return "\n".join(lines)


def chart(path: Path, results: list[dict[str, Any]]) -> None:
    """Per pack: classes per batch (x ideal) and read samples/s against samples held per worker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    packs = list(dict.fromkeys(e["pack"] for e in results))
    fig, axes = plt.subplots(2, len(packs), figsize=(6.5 * len(packs), 8), squeeze=False)
    for column, pack in enumerate(packs):
        entries = [e for e in results if e["pack"] == pack]
        for row, (metric, name) in enumerate(
            (("classes_ratio", "classes per batch / ideal"), ("samples_per_s", "read samples/s (warm)"))
        ):
            ax = axes[row, column]
            lines: dict[str, list[dict[str, Any]]] = {}
            for e in entries:
                if e["family"] == "shardpipe" and not e["is_default"] and e["label"] != "shardpipe reference":
                    lines.setdefault(f"shardpipe block_size={e['block_size']}", []).append(e)
                elif e["family"] == "webdataset":
                    lines.setdefault("webdataset shuffle(n)", []).append(e)
            for label, points in lines.items():
                points.sort(key=lambda e: e["memory_samples"])
                style = "s--" if label.startswith("webdataset") else "o-"
                ax.plot(
                    [e["memory_samples"] for e in points], [e[metric] for e in points], style, label=label
                )
            for e in entries:
                if e["family"] == "global-permutation":
                    ax.axhline(
                        e[metric], color="black", linestyle=":", label="global permutation (no buffer)"
                    )
                elif e["is_default"]:
                    ax.plot(e["memory_samples"], e[metric], "*", color="red", markersize=14, label="defaults")
                elif e["label"] == "shardpipe reference":
                    ax.plot(
                        e["memory_samples"],
                        e[metric],
                        "x",
                        color="black",
                        markersize=10,
                        label="reference (256, 1024)",
                    )
            if row == 0:
                ax.axhline(1.0, color="grey", linewidth=0.8)
                ax.set_ylim(0, max(1.1, *(e[metric] * 1.05 for e in entries)))  # the scale of "how far off"
            ax.set_xscale("log", base=2)
            ax.set_xlabel("samples held by the shuffle per worker")
            ax.set_ylabel(name)
            ax.set_title(f"{pack} pack", fontsize=10)
    handles, labels = axes[0, 0].get_legend_handles_labels()  # one legend, below the panels it explains
    unique = dict(zip(labels, handles, strict=True))
    fig.legend(unique.values(), unique.keys(), loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
