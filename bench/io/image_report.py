"""The image profiles' report (a :class:`bench.io.report.Kind`): rows per profile with paired ratios to
the baselines, and the verdict lines of a ``--data`` run.

Each row's ``x`` columns are paired ratios (``bench.io.targets.paired_ratio``) to the baseline named in the
header, within one profile of one run; absolute samples/s compare only on like hardware and data.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.io import byte_report, report, targets
from bench.io.image_contenders import CROP, LIMIT, LIMIT_256, is_limit
from bench.io.image_data import PREPARED_MAX_SIDE
from bench.io.report import Meta, Results
from testkit.photos import QUALITY

BASELINES = ("imagefolder-pil", "webdataset-pil", "shardpipe-pil", LIMIT)
"""The ``x`` columns: shardpipe-pil only where imagefolder-pil did not run (``--data``)."""
RULES = {
    "data": "real photographs (testkit.photos: crops of scikit-learn's two sample photos, resampled, grain"
    f" added, baseline 4:2:0 JPEG at quality {QUALITY[0]}-{QUALITY[1]}, one in five portrait), nothing"
    " downloaded; built once per fingerprint; shardpipe's tar pack of them, and the same pack with"
    f" --image-max-side {PREPARED_MAX_SIDE}",
    "crop": f"every contender yields (B, 3, {CROP}, {CROP}) uint8 crops by torchvision's RandomResizedCrop"
    " algorithm and defaults (scale (0.08, 1), ratio (3/4, 4/3), bilinear antialiased resize) and a"
    " horizontal flip, and int64 labels; the Pillow rows run it with Pillow on the full decoded image"
    " (torchvision itself does not install beside the pinned torch), the fused rows run"
    f" loaders.RandomResizedCrop({CROP})",
    "epochs": "a run cycles epochs (set_epoch between passes, workers kept), so a window may be longer than"
    " one epoch; the epoch boundaries' stalls are part of it",
    "step": byte_report.RULES["step"],
    "warmup": byte_report.RULES["warmup"],
    "window": byte_report.RULES["window"],
    "cpu": "CPU seconds (user + system) of the main process and its live children (the workers) over the"
    " measured window, per image; decode-limit: its processes' own",
    "decode-limit": f"loaders.RandomResizedCrop({CROP}) alone on in-memory batch columns of the same JPEG"
    " bytes (RaggedBytes.from_list, keys, DecodeContext), in --workers processes started together, each"
    " timing its loop; samples/s summed; the same number of samples as a loader's window",
    "repeats": "--repeats rounds, every contender once per round, order rotated; median reported, min-max"
    " as spread",
    "paired": targets.RULE,
    "warm": "every file a contender reads is read once, front to back, before each of its runs",
    "verdict": byte_report.RULES["verdict"],
}
COLUMNS = ("contender", "samples/s", "spread", "CPU ms/image", "wait", "verdict", "1st batch")
FIGURE = "images.png"
CAPTION = "samples/s per contender (median of repeats, bars min-max; grey: decode alone)"


def add_paired(entries: Results) -> None:
    """Each entry's paired ratio to each baseline that ran beside it."""
    by_name = {e["contender"]: e for e in entries}
    bases = [b for b in BASELINES if b in by_name]
    if "imagefolder-pil" in bases and "shardpipe-pil" in bases:
        bases.remove("shardpipe-pil")
    for entry in entries:
        entry["paired"] = {
            base: targets.paired_ratio(targets.per_round(by_name[base]), targets.per_round(entry))
            for base in bases
        }


def _row(e: dict[str, Any], bases: list[str]) -> list[str]:
    limit = is_limit(e["contender"])
    return [
        e["contender"],
        f"{e['samples_per_s']:,.0f}",
        f"{e['samples_per_s_min']:,.0f}-{e['samples_per_s_max']:,.0f}",
        f"{e['cpu_ms_per_sample']:.2f}",
        "-" if limit else f"{e['wait_fraction']:.0%}",
        e["verdict"],
        "-" if limit else f"{e['first_batch_s']:.2f} s",
        *(f"{e['paired'][b]:.2f}" if b in e["paired"] else "-" for b in bases),
    ]


def _rows(entries: Results) -> list[list[str]]:
    bases = [b for b in BASELINES if any(b in e["paired"] for e in entries)]
    header = [*COLUMNS, *(f"x {b} (paired)" for b in bases)]
    return [header, *(_row(e, bases) for e in entries)]


def _panels(meta: Meta, results: Results) -> list[tuple[str, Results]]:
    """The entries by profile, each group under its title."""
    groups: dict[str, Results] = {}
    for entry in results:
        groups.setdefault(entry["profile"], []).append(entry)
    panels = []
    for profile, entries in groups.items():
        data = meta["datasets"][profile]
        title = (
            f"{profile} profile: {data['num_samples']:,} photos of ~{data['size']}, "
            f"{data['mean_sample_bytes'] / 1e3:,.0f} kB each"
        )
        panels.append((title, entries))
    return panels


def _tables(meta: Meta, results: Results, heading: str) -> list[str]:
    return report.tables([(title, _rows(entries)) for title, entries in _panels(meta, results)], heading)


def table(meta: Meta, results: Results) -> str:
    return "\n".join(_tables(meta, results, ""))


def docs_results(meta: Meta, results: Results) -> list[str]:
    return [*_tables(meta, results, "####"), *report.targets_section(meta, "####")]


def markdown(meta: Meta, results: Results) -> str:
    verdicts = [f"- {line}" for line in meta.get("verdicts", [])]
    body = [*verdicts, *([""] if verdicts else []), *docs_results(meta, results)]
    return report.markdown("shardpipe image input benchmark", meta, body)


def _color(entry: dict[str, Any]) -> str:
    return "tab:gray" if is_limit(entry["contender"]) else report.verdict_color(entry)


def _note(e: dict[str, Any]) -> str:
    wait = "" if is_limit(e["contender"]) else f", wait {e['wait_fraction']:.0%}"
    return f"  {e['samples_per_s']:,.0f}/s, {e['cpu_ms_per_sample']:.2f} CPU ms/image{wait}"


def chart(path: Path, meta: Meta, results: Results) -> None:
    report.chart(
        path,
        _panels(meta, results),
        value="samples_per_s",
        xlabel="samples/s (median of repeats, bars: min-max)",
        note=_note,
        color=_color,
        room=1.7,
        legend=report.verdict_legend(meta, results) + ", grey: the decode alone",
    )


def verdicts(results: Results, data: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """What a ``--data`` run says: is the input the bottleneck, and what the fused path and pack-time
    resizing would give."""
    by = {e["contender"]: e for e in results}
    batch = args.batch_size
    lines = [
        f"your data: {data['path']}, field {data['field']}: {data['num_samples']:,} samples, median "
        f"{data['size']} px, {data['mean_sample_bytes'] / 1e3:,.0f} kB each (of the "
        f"{data['photos_in_memory']} read for the decode limits)"
    ]
    for name, what in (
        ("shardpipe-pil", "per-sample Pillow (a transform)"),
        ("shardpipe-fused", "fused crops"),
    ):
        if name in by:
            e = by[name]
            lines.append(
                f"{what} ({name}): {e['samples_per_s']:,.0f} samples/s, "
                f"{e['cpu_ms_per_sample']:.2f} CPU ms/image; "
                f"a batch of {batch} every {1000 * batch / e['samples_per_s']:,.0f} ms with {args.workers} "
                f"workers: a training step shorter than that waits for input (wait {e['wait_fraction']:.0%} "
                f"of the step at --compute-ms {args.compute_ms:g}: {e['verdict']})"
            )
    if {"shardpipe-fused", "shardpipe-pil"} <= by.keys():
        ratio = by["shardpipe-fused"]["paired"].get("shardpipe-pil")
        if ratio is None:
            ratio = by["shardpipe-fused"]["samples_per_s"] / by["shardpipe-pil"]["samples_per_s"]
        lines.append(f"the fused path gives {ratio:.2f}x the per-sample Pillow path's samples/s")
    if {"shardpipe-fused", LIMIT} <= by.keys():
        lines.append(
            f"decode limit ({args.workers} processes, the crop alone): {by[LIMIT]['samples_per_s']:,.0f} "
            f"samples/s; the fused loader reaches {by['shardpipe-fused']['paired'][LIMIT]:.2f}x of it"
        )
    if {LIMIT, LIMIT_256} <= by.keys():
        gain = by[LIMIT_256]["paired"][LIMIT]
        shrunk = data["prepared_mean_sample_bytes"] / data["mean_sample_bytes"]
        lines.append(
            f"prepared at pack time (shardpipe pack --image-max-side {PREPARED_MAX_SIDE}): decode limit "
            f"{by[LIMIT_256]['samples_per_s']:,.0f} samples/s, {gain:.2f}x today's, images {shrunk:.0%} of "
            "their size (measured on the same photos shrunk in memory)"
        )
    return lines
