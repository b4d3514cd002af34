"""The image runs' outputs: the terminal table, ``report.md``, the plot, the ``--docs`` tables, and the
verdict lines of a ``--data`` run.

Each row's ``x`` columns are paired ratios (``bench.targets.paired_ratio``) to the baseline named in the
header, within one profile of one run; absolute samples/s compare only on like hardware and data.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import targets as targets_module
from bench.image_contenders import LIMIT, is_limit
from bench.report import aligned, markdown_table

BASELINES = ("imagefolder-pil", "webdataset-pil", "shardpipe-pil", LIMIT)
"""The ``x`` columns: shardpipe-pil only where imagefolder-pil did not run (``--data``)."""
RULES = {
    "data": "real photographs (bench.photos: crops of scikit-learn's two sample photos, resampled, grain"
    " added, baseline 4:2:0 JPEG at quality 85-95, one in five portrait), nothing downloaded; built once"
    " per fingerprint; shardpipe's tar pack of them, and the same pack with --image-max-side 256",
    "crop": "every contender yields (B, 3, 224, 224) uint8 crops by torchvision's RandomResizedCrop"
    " algorithm and defaults (scale (0.08, 1), ratio (3/4, 4/3), bilinear antialiased resize) and a"
    " horizontal flip, and int64 labels; the Pillow rows run it with Pillow on the full decoded image"
    " (torchvision itself does not install beside the pinned torch), the fused rows run"
    " loaders.RandomResizedCrop(224)",
    "epochs": "a run cycles epochs (set_epoch between passes, workers kept), so a window may be longer than"
    " one epoch; the epoch boundaries' stalls are part of it",
    "step": "from asking the loader for a batch to asking for the next; data wait = time blocked in next()",
    "warmup": "the first --warmup steps of every run are discarded (worker start, first shuffle windows)",
    "window": "the next --steps steps; throughput = samples in the window / the window's wall time",
    "cpu": "CPU seconds (user + system) of the main process and its live children (the workers) over the"
    " measured window, per image; decode-limit: its processes' own",
    "decode-limit": "loaders.RandomResizedCrop(224) alone on in-memory batch columns of the same JPEG"
    " bytes (RaggedBytes.from_list, keys, DecodeContext), in --workers processes started together, each"
    " timing its loop; samples/s summed; the same number of samples as a loader's window",
    "repeats": "--repeats rounds, every contender once per round, order rotated; median reported, min-max"
    " as spread",
    "paired": targets_module.RULE,
    "warm": "every file a contender reads is read once, front to back, before each of its runs",
    "verdict": "input-bound when the median wait fraction > --threshold, else compute-bound",
}
COLUMNS = ("contender", "samples/s", "spread", "CPU ms/image", "wait", "verdict", "1st batch")


def add_paired(entries: list[dict[str, Any]]) -> None:
    """Each entry's paired ratio to each baseline that ran beside it."""
    by_name = {e["contender"]: e for e in entries}
    bases = [b for b in BASELINES if b in by_name]
    if "imagefolder-pil" in bases and "shardpipe-pil" in bases:
        bases.remove("shardpipe-pil")
    for entry in entries:
        entry["paired"] = {
            base: targets_module.paired_ratio(
                targets_module.per_round(by_name[base]), targets_module.per_round(entry)
            )
            for base in bases
        }


def _columns(entries: list[dict[str, Any]]) -> list[str]:
    bases = [b for b in BASELINES if any(b in e["paired"] for e in entries)]
    return [*COLUMNS, *(f"x {b} (paired)" for b in bases)]


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


def _groups(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in results:
        groups.setdefault(entry["profile"], []).append(entry)
    return groups


def _title(profile: str, dataset: dict[str, Any]) -> str:
    return (
        f"{profile} profile: {dataset['num_samples']:,} photos of ~{dataset['size']}, "
        f"{dataset['mean_sample_bytes'] / 1e3:,.0f} kB each"
    )


def _rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    header = _columns(entries)
    bases = [c[2:].removesuffix(" (paired)") for c in header[len(COLUMNS) :]]
    return [header, *(_row(e, bases) for e in entries)]


def table(meta: dict[str, Any], results: list[dict[str, Any]], targets: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    for profile, entries in _groups(results).items():
        lines += ["", _title(profile, meta["datasets"][profile]), *aligned(_rows(entries))]
    if targets:
        lines += ["", "targets (paired ratios):", *targets_module.lines(targets)]
    return "\n".join(lines)


def docs_results(
    meta: dict[str, Any], results: list[dict[str, Any]], targets: list[dict[str, Any]]
) -> list[str]:
    lines: list[str] = []
    for profile, entries in _groups(results).items():
        lines += [
            f"#### {_title(profile, meta['datasets'][profile])}",
            "",
            *markdown_table(_rows(entries)),
            "",
        ]
    if targets:
        lines += ["#### Targets", "", *targets_module.markdown(targets)]
    return lines


def markdown(meta: dict[str, Any], results: list[dict[str, Any]], targets: list[dict[str, Any]]) -> str:
    hw, params = meta["hardware"], meta["parameters"]
    lines = [
        "# shardpipe image input benchmark",
        "",
        f"{meta['created']} on {hw['cpu']} ({hw['cores_usable']} usable cores, {hw['ram_gib']} GiB RAM, "
        f"GPU: {hw['gpu'] or 'none'}); device {meta['device']}; batch {params['batch_size']}, "
        f"{params['workers']} workers, compute {params['compute_ms']} ms/step, "
        f"{params['repeats']} repeat(s).",
        "",
        *(f"- {line}" for line in meta.get("verdicts", [])),
        *([""] if meta.get("verdicts") else []),
        *docs_results(meta, results, targets),
        "## Rules",
        "",
        *(f"- **{k}**: {v}" for k, v in meta["rules"].items()),
        "",
        "## Data",
        "",
        "```json",
        json.dumps(meta["datasets"], indent=1),
        "```",
        "",
        "## Versions",
        "",
        "```json",
        json.dumps(meta["versions"], indent=1),
        "```",
        "",
    ]
    return "\n".join(lines)


def chart(path: Path, meta: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """One horizontal bar panel per profile: samples/s with min-max bars, CPU per image and wait noted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _groups(results)
    rows = max(len(entries) for entries in groups.values())
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 2.2 + 0.45 * rows * len(groups)), squeeze=False)
    for ax, (profile, entries) in zip(axes[:, 0], groups.items(), strict=True):
        names = [e["contender"] for e in entries]
        values = [e["samples_per_s"] for e in entries]
        errors = [
            [v - e["samples_per_s_min"] for v, e in zip(values, entries, strict=True)],
            [e["samples_per_s_max"] - v for v, e in zip(values, entries, strict=True)],
        ]
        colors = [
            "tab:gray"
            if is_limit(e["contender"])
            else "tab:orange"
            if e["verdict"] == "input-bound"
            else "tab:green"
            for e in entries
        ]
        ax.barh(names, values, xerr=errors, color=colors, capsize=3)
        ax.invert_yaxis()
        for i, e in enumerate(entries):
            wait = "" if is_limit(e["contender"]) else f", wait {e['wait_fraction']:.0%}"
            note = f"  {e['samples_per_s']:,.0f}/s, {e['cpu_ms_per_sample']:.2f} CPU ms/image{wait}"
            ax.text(e["samples_per_s_max"], i, note, va="center", fontsize=8)
        ax.set_xlim(0, max(e["samples_per_s_max"] for e in entries) * 1.7)
        ax.set_xlabel("samples/s (median of repeats, bars: min-max)")
        ax.set_title(_title(profile, meta["datasets"][profile]), fontsize=10)
    fig.suptitle("orange: input-bound, green: compute-bound, grey: the decode alone", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(
    out: Path, meta: dict[str, Any], results: list[dict[str, Any]], targets: list[dict[str, Any]]
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.json", out / "report.md", out / "images.png"]
    paths[0].write_text(json.dumps({**meta, "results": results, "targets": targets}, indent=1) + "\n")
    paths[1].write_text(markdown(meta, results, targets))
    chart(paths[2], meta, results)
    return paths
