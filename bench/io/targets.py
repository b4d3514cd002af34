"""bench-io's targets, judged on paired ratios within one run.

Every contender runs once per round, the order rotated between rounds, so round ``r`` of two contenders
ran back to back on the same machine state. A target's value is the median over rounds of the ratio of
their samples/s in the same round (:func:`paired_ratio`): the machine's drift between rounds cancels, which
the ratio of medians does not. Targets compare like with like, within one (profile, cache) group; a target
whose contenders did not run (``--contenders``) is left out, never judged on a stand-in.
"""

from __future__ import annotations

from statistics import median
from typing import Any

from bench.io.contenders import CLS_RAW
from bench.io.image_contenders import FUSED_PREPARED, LIMIT

CLS_TARGET = 0.9
"""The least ratio of every format's cls-decoding row to its raw-bytes row (:data:`CLS_RAW`)."""
READ_PATH_TARGETS = {("large", 0): 0.9, ("small", 0): 0.7, ("large", 2): 1.2, ("small", 2): 1.2}
"""(profile, workers) -> the least ratio of every format's ``-cls`` row to the hand-written ``lmdb-loop``,
warm (issue 33's targets; other worker counts are not judged)."""
IMAGE_TARGETS = (  # (profile, contender, baseline, threshold): contender >= threshold x baseline (issue 35)
    ("images", "shardpipe-fused", "imagefolder-pil", 1.5),
    ("images", "shardpipe-fused", "webdataset-pil", 1.5),
    ("images-large", "shardpipe-fused", "imagefolder-pil", 2.5),
    ("images", "shardpipe-fused", LIMIT, 0.85),
    ("images-large", "shardpipe-fused", LIMIT, 0.85),
    ("images", FUSED_PREPARED, "imagefolder-pil", 3.0),
    ("images-large", FUSED_PREPARED, "imagefolder-pil", 3.0),
)
RULE = (
    "a target's value is the median over rounds of (contender samples/s / baseline samples/s) within the "
    "round (paired: drift between rounds cancels); met when the value >= the threshold"
)


def per_round(entry: dict[str, Any]) -> list[float]:
    """An entry's samples/s, round by round (its runs are kept in round order)."""
    return [float(run["samples_per_s"]) for run in entry["runs"]]


def paired_ratio(baseline: list[float], contender: list[float]) -> float:
    """Median over rounds of the contender's samples/s over the baseline's in the same round."""
    return median(own / base for base, own in zip(baseline, contender, strict=True))


def judged(
    group: dict[str, Any], contender: str, baseline: str, threshold: float, **extra: Any
) -> dict[str, Any]:
    """One target, judged on the entries of one group (by contender name)."""
    value = paired_ratio(per_round(group[baseline]), per_round(group[contender]))
    return {
        "profile": group[contender]["profile"],
        "cache": group[contender].get("cache", "warm"),
        "target": f"{contender} >= {threshold:g}x {baseline}",
        "contender": contender,
        "baseline": baseline,
        "value": value,
        "threshold": threshold,
        "met": value >= threshold,
        "rounds": len(group[contender]["runs"]),
        **extra,
    }


def _groups(results: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    groups: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for entry in results:
        groups.setdefault((entry["profile"], entry.get("cache", "warm")), {})[entry["contender"]] = entry
    return groups


def cls_targets(results: list[dict[str, Any]], workers: int) -> list[dict[str, Any]]:
    """Each format's ``-cls`` row against its raw-bytes row, and against the hand-written ``lmdb-loop``
    (:data:`READ_PATH_TARGETS`), at this run's worker count."""
    found = []
    for group in _groups(results).values():
        for contender, baseline in CLS_RAW.items():
            if contender in group and baseline in group:
                found.append(judged(group, contender, baseline, CLS_TARGET, workers=workers))
        profile = next(iter(group.values()))["profile"]
        threshold = READ_PATH_TARGETS.get((profile, workers))
        warm = next(iter(group.values())).get("cache", "warm") == "warm"
        if threshold is not None and warm and "lmdb-loop" in group:
            for contender in CLS_RAW:
                if contender in group:
                    found.append(judged(group, contender, "lmdb-loop", threshold, workers=workers))
    for target in found:
        target["target"] += f" (W={workers})"
    return found


def image_targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The image profiles' targets (:data:`IMAGE_TARGETS`) whose contenders ran."""
    groups = _groups(results)
    found = []
    for profile, contender, baseline, threshold in IMAGE_TARGETS:
        group = groups.get((profile, "warm"), {})
        if contender in group and baseline in group:
            found.append(judged(group, contender, baseline, threshold))
    return found


def _where(target: dict[str, Any]) -> str:
    cache = target.get("cache", "warm")
    return target["profile"] if cache == "warm" else f"{target['profile']} ({cache})"


def lines(targets: list[dict[str, Any]]) -> list[str]:
    """One plain line per target: profile, name, measured value, met or missed."""
    return [
        f"{_where(t):12} {t['target']:56} {t['value']:6.2f}x  {'met' if t['met'] else 'MISSED'}"
        for t in targets
    ]


def markdown(targets: list[dict[str, Any]]) -> list[str]:
    """The targets as a Markdown table (empty when none ran)."""
    if not targets:
        return []
    rows = [
        "| profile | target | paired ratio (median of rounds) | rounds | verdict |",
        "|---|---|---:|---:|---|",
    ]
    for t in targets:
        verdict = "met" if t["met"] else "missed"
        rows.append(f"| {_where(t)} | {t['target']} | {t['value']:.2f}x | {t['rounds']} | {verdict} |")
    return [*rows, ""]
