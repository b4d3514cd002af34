"""The pack benchmark's targets (issue 9, section 6; the Ray engine's, issue 12): defined here once, judged
on a run's rows by :func:`targets`, and stated with their thresholds in every report (:func:`rule`).

All are paired ratios (:func:`bench.pack.run.paired_ratio`), processes against processes: a throughput
ratio at least its threshold, except the no-op map's, a time ratio at most its threshold.
"""

from __future__ import annotations

from typing import Any

from bench.pack.contenders import (
    BARE_POOL,
    FLAT_PARQUET,
    FORMATS,
    HF_PARQUET,
    MAP_NOOP,
    PREPARED,
    RAY,
    SHARDWRITER_LOOP,
    SHARDWRITER_SCRIPT,
    TAR,
)
from bench.pack.run import paired_ratio

FORMAT_TARGET = 0.5  # every format's CLI against tar cf
SHARDWRITER_TARGETS = {"small": 6.0, "large": 1.5}  # shardpipe tar's CLI against ShardWriter as a script
MAP_TARGET = 1.15  # the no-op map's pack time over the same pack's without a map: at most
IMAGE_TARGETS = {BARE_POOL: 0.9, SHARDWRITER_LOOP: 1.8}  # shardpipe's CLI against these, preparing images
RAY_TARGETS = {"small": 0.7, "large": 0.85}  # the Ray engine against the local one, both in-process
PARQUET_TARGET = 0.8  # the CLI on a Hugging Face-style Parquet folder against the same rows as a flat list
LOCAL_IN_PROCESS = "shardpipe tar (in-process)"


def rule() -> str:
    """The targets and their thresholds, as one line of the report's rules."""
    shardwriter = ", ".join(f"{t:g}x ({p})" for p, t in SHARDWRITER_TARGETS.items())
    images = " and ".join(f"{t:g}x the {name}" for name, t in IMAGE_TARGETS.items())
    ray = ", ".join(f"{t:g}x ({p})" for p, t in RAY_TARGETS.items())
    return (
        "judged on paired ratios, processes against processes: each format's CLI (start-up included) at"
        f" least {FORMAT_TARGET:g}x {TAR}; shardpipe tar's CLI at least {shardwriter} {SHARDWRITER_SCRIPT};"
        f" the no-op map's CLI pack taking at most {MAP_TARGET:g}x the time of the same CLI pack without a"
        f" map; preparing images, shardpipe's CLI at least {images}; with --engine ray, the Ray engine at"
        f" least {ray} the local engine, both in-process; {HF_PARQUET} at least {PARQUET_TARGET:g}x"
        f" {FLAT_PARQUET} (the same rows, both the CLI)"
    )


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets per profile, judged by paired ratios of processes against processes.

    Formats against ``tar cf``: the CLI rows (start-up included, as ``tar cf``'s is). shardpipe's tar
    against ShardWriter: the CLI against ShardWriter run as a script. The no-op map: its CLI pack's time
    over the same CLI pack's without a map, at most. Preparing images: shardpipe's CLI against the bare
    pool and against the one-loop ShardWriter script. A Parquet dataset in Hugging Face's layout: the CLI
    against the CLI on the same rows as a flat Parquet list. A target whose contenders did not run
    (``--only``, ``--profile``) is left out.
    """
    found = []
    for profile in dict.fromkeys(r["profile"] for r in rows):
        times = {r["contender"]: r["seconds"] for r in rows if r["profile"] == profile}
        for fmt in FORMATS:
            if f"shardpipe {fmt}" in times:
                value = paired_ratio(times[TAR], times[f"shardpipe {fmt}"])
                name = f"shardpipe {fmt} >= {FORMAT_TARGET}x {TAR}"
                found.append(_target(profile, name, value, FORMAT_TARGET))
        if {RAY, LOCAL_IN_PROCESS} <= times.keys() and profile in RAY_TARGETS:
            value = paired_ratio(times[LOCAL_IN_PROCESS], times[RAY])
            name = f"Ray engine >= {RAY_TARGETS[profile]:g}x the local engine (in-process, tar)"
            found.append(_target(profile, name, value, RAY_TARGETS[profile]))
        threshold = SHARDWRITER_TARGETS.get(profile)
        if threshold is not None and {"shardpipe tar", SHARDWRITER_SCRIPT} <= times.keys():
            value = paired_ratio(times[SHARDWRITER_SCRIPT], times["shardpipe tar"])
            name = f"shardpipe tar >= {threshold:g}x {SHARDWRITER_SCRIPT}"
            found.append(_target(profile, name, value, threshold))
        if {MAP_NOOP, "shardpipe tar"} <= times.keys():
            value = paired_ratio(times[MAP_NOOP], times["shardpipe tar"])  # the map's time / no map's
            name = f"{MAP_NOOP}: time <= {MAP_TARGET:g}x shardpipe tar (no map)"
            found.append(_target(profile, name, value, MAP_TARGET, at_most=True))
        for baseline, threshold in IMAGE_TARGETS.items():
            if {PREPARED, baseline} <= times.keys():
                value = paired_ratio(times[baseline], times[PREPARED])
                found.append(_target(profile, f"{PREPARED} >= {threshold:g}x {baseline}", value, threshold))
        if {HF_PARQUET, FLAT_PARQUET} <= times.keys():
            value = paired_ratio(times[FLAT_PARQUET], times[HF_PARQUET])
            name = f"{HF_PARQUET} >= {PARQUET_TARGET:g}x {FLAT_PARQUET}"
            found.append(_target(profile, name, value, PARQUET_TARGET))
    return found


def _target(profile: str, name: str, value: float, threshold: float, at_most: bool = False) -> dict[str, Any]:
    """A target judged: a throughput ratio at least ``threshold``, or (``at_most``) a time ratio at most."""
    return {
        "profile": profile,
        "target": name,
        "value": value,
        "threshold": threshold,
        "rule": "<=" if at_most else ">=",
        "met": value <= threshold if at_most else value >= threshold,
    }
