"""The pack benchmark's report: the rules of its measurement, its tables as Markdown (report.md, the
terminal and the docs section print the same lines), with the targets judged and their thresholds."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from bench.pack.contenders import IMAGE_MAX_SIDE, IMAGE_QUALITY, MAP_SPEC
from bench.pack.run import STARTUP_REPEATS
from bench.pack.targets import rule

RULES = {
    "data": "small, large: one .bin file per sample in ten class folders, seeded random bytes; images: real"
    " photos (testkit.photos: crops of scikit-learn's two sample photos, about 500x375 JPEG, one in five"
    " portrait); parquet: rows of 1 KiB seeded random bytes plus an int64 label, in row groups of 100,"
    " written twice: as a Hugging Face-style folder (data/train-00000-of-00001.parquet, no key column,"
    " the schema metadata datasets writes) and as a flat Parquet list with a key column; each tree built"
    " once per fingerprint",
    "warm": "each tree is read once before its profile's rounds: the packers are timed, not the disk",
    "sync": "os.sync() runs, untimed, before every run: one run's write-back stays out of the next's time",
    "bytecode": "the project's bytecode is written before the first run, as an install writes it: no CLI or"
    " script run compiles shardpipe's sources",
    "rounds": "every contender runs once per round, the order rotated between rounds; --repeats rounds",
    "spread": "the median of the rounds is reported, min-max of the rounds as spread",
    "paired": "median over rounds of (the baseline's time / the contender's time) within the round: drift"
    " cancels; the baseline is tar cf for small and large, the bare pool for images, the flat Parquet list"
    " for parquet",
    "targets": rule(),
    "order": "every shardpipe row packs in its default order (hashed): the target against tar cf is the"
    " pack a user gets without --order",
    "map": f"the --map rows run {MAP_SPEC}, which returns each sample unchanged: the cost measured is"
    " shardpipe's plan with a map (map pieces, stage, then write shards), none of it the function's",
    "images": f"every images contender runs ImagePreparation({IMAGE_MAX_SIDE}, {IMAGE_QUALITY}).prepare on"
    " each photo (what --image-max-side/--image-quality run): shardpipe with --workers processes; the bare"
    " pool, a multiprocessing.Pool(--workers) writing each result as a file, its processes set up as"
    " shardpipe's pack processes are (glibc keeps freed memory, GC paused, OpenBLAS single-threaded): the"
    " function plus file I/O, the limit; the same pool with plain processes, as a user writes it (shown);"
    " the one-loop ShardWriter script, webdataset's documented shape: one process reading, preparing and"
    " writing in a loop; the pool-fed ShardWriter, a Pool(--workers) preparing the files in order for that"
    " loop to write; the ShardWriter scripts run plain processes, as users run them; every script's"
    " start-up (its imports included) is timed",
    "check": "after every run, untimed: the output holds every sample (manifest counts, or the tar's size);"
    " for images, every photo under its key, each decoding with its longest side"
    f" {IMAGE_MAX_SIDE}",
    "durability": "shardpipe fsyncs each shard before publishing it, tar cf, ShardWriter and the bare pool"
    " do not; the 'tar cf + fsync' row shows what that costs tar",
    "cpu_s": "median over rounds of the user + system CPU time of this process and its waited-for children",
}


def tar_version() -> str:
    tar = subprocess.run(["tar", "--version"], capture_output=True, text=True, check=False).stdout
    return tar.splitlines()[0] if tar else "unknown"


def render(report: dict[str, Any]) -> str:
    """The table, as Markdown (the terminal prints the same text)."""
    p = report["parameters"]
    lines = [
        "# shardpipe pack benchmark",
        "",
        f"{report['machine']['cpu']}, {report['machine']['cores_usable']} usable cores; "
        f"--workers {p['workers']}, --max-bytes none, --max-samples per profile below; "
        f"{p['repeats']} interleaved round(s), median (min-max); trees read once before timing (warm cache). "
        "'x' divides medians by the baseline's (tar cf for the byte profiles, the bare pool for images, "
        "the flat Parquet list for parquet); "
        "'paired' is the median of per-round ratios to it (each round runs every contender back to back), "
        "which the targets use.",
        "",
        *tables(report),
    ]
    return "\n".join(lines) + "\n"


def chart(path: Path, report: dict[str, Any]) -> None:
    """One panel per profile: each contender's samples/s (median, bars min-max), its paired ratio to the
    profile's baseline beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = list(dict.fromkeys(r["profile"] for r in report["results"]))
    height = sum(1.0 + 0.4 * sum(r["profile"] == p for r in report["results"]) for p in profiles)
    fig, axes = plt.subplots(len(profiles), 1, figsize=(9, height), squeeze=False)
    for ax, profile in zip(axes[:, 0], profiles, strict=True):
        rows = [r for r in report["results"] if r["profile"] == profile]
        values = [r["samples_per_s"] for r in rows]
        spread = [[v - r["samples_per_s_range"][0] for v, r in zip(values, rows, strict=True)],
                  [r["samples_per_s_range"][1] - v for v, r in zip(values, rows, strict=True)]]  # fmt: skip
        ax.barh([r["contender"] for r in rows], values, xerr=spread, capsize=3, color="tab:blue")
        for i, r in enumerate(rows):
            note = f"  {r['paired_ratio_to_baseline']:.2f}x {r['baseline']}"
            ax.text(r["samples_per_s_range"][1], i, note, va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(r["samples_per_s_range"][1] for r in rows) * 1.45)
        ax.set_title(f"{profile} profile", fontsize=10)
        ax.set_xlabel("samples/s packed (median of rounds, bars: min-max; label: paired ratio)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def tables(report: dict[str, Any]) -> list[str]:
    """The results tables (one per baseline), the targets judged, the CLI's start-up and the profiles, as
    Markdown lines."""
    p = report["parameters"]
    lines: list[str] = []
    for baseline in dict.fromkeys(r["baseline"] for r in report["results"]):
        lines += [
            f"| profile | contender | samples/s | MB/s | x {baseline} | paired | seconds: median (min-max) "
            "| CPU s |",
            "|---|---|---:|---:|---:|---:|---|---:|",
        ]
        for r in report["results"]:
            if r["baseline"] != baseline:
                continue
            lo, hi = r["samples_per_s_range"]
            lines.append(
                f"| {r['profile']} | {r['contender']} | {r['samples_per_s']:,.0f} ({lo:,.0f}-{hi:,.0f}) "
                f"| {r['mb_per_s']:,.1f} | {r['ratio_to_baseline']:.2f} "
                f"| {r['paired_ratio_to_baseline']:.2f} "
                f"| {r['median_s']:.3f} ({r['min_s']:.3f}-{r['max_s']:.3f}) | {r['cpu_s']:.2f} |"
            )
        lines.append("")
    lines += ["| profile | target (paired ratio) | measured | |", "|---|---|---:|---|"]
    for t in report["targets"]:
        lines.append(
            f"| {t['profile']} | {t['target']} | {t['value']:.2f}x | {'met' if t['met'] else 'MISSED'} |"
        )
    lines += [
        "",
        f"The CLI's start-up (a 3-file pack, median of {STARTUP_REPEATS}): "
        f"{report['costs']['cli_startup_s']:.3f} s.",
    ]
    lines += ["", "Profiles:"]
    for name, prof in p["profiles"].items():
        shards = f"--max-samples {prof['max_samples']:,} ({prof['shards']} shards)"
        if "group_rows" in prof:
            lines.append(
                f"- {name}: {prof['num_samples']:,} rows of {prof['sample_bytes']:,} bytes of binary plus an"
                f" int label, row groups of {prof['group_rows']}, a Hugging Face-style folder against a flat"
                f" Parquet list, {shards}"
            )
        elif "sample_bytes" in prof:
            lines.append(
                f"- {name}: {prof['num_samples']:,} files of {prof['sample_bytes']:,} bytes, {shards}"
            )
        else:
            width, height = prof["size"]
            lines.append(
                f"- {name}: {prof['num_samples']:,} JPEG photos of {width}x{height} (one in five portrait), "
                f"{prof['payload_bytes'] / 2**20:,.1f} MiB, prepared to a longest side of {prof['max_side']} "
                f"at quality {prof['quality']}, {shards}"
            )
    return lines
