"""Scaling numbers from the ranks' step timings, the "what grew" verdict, and the report files.

Per rank count: global samples/s per window (all ranks' samples / the slowest rank's window time), median
and min-max over windows; efficiency from the medians; TFLOPS per device from the counted model FLOPs; and
per-part medians over every measured step of every rank, compared with one rank's to name what grew.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.common.report import measured_on
from bench.common.tables import aligned, markdown_table

PARTS = ("data_wait", "prepare", "forward", "backward", "allreduce", "optimizer", "other")
RULES = {
    "weak_scaling": "per-rank batch size, model, threads and DataLoader workers fixed; one launch per rank"
    " count",
    "step": "from asking for a batch to asking for the next; data_wait = time blocked in next()",
    "parts": "prepare = bytes to tensors; backward = until DDP's last gradient bucket is ready; allreduce ="
    " the rest of loss.backward() (waiting for the all-reduce, gradients written back); other = step - parts",
    "allreduce_in_flight": "union of the buckets' [ready, all-reduce done] intervals (comm hook), partly"
    " hidden behind backward compute; on CUDA 'ready' is host time, so allreduce also holds backward kernels"
    " still queued then",
    "warmup": "the first --warmup steps of each launch are discarded (workers start, DDP buckets, caches)",
    "window": "then --repeats consecutive windows of --steps steps; samples/s of a window = samples over all"
    " ranks / the slowest rank's window time",
    "repeats": "median over windows reported, min-max as spread; part times are medians over all measured"
    " steps of all ranks",
    "efficiency": "SPS_N / (N x SPS_1) with the median SPS",
    "tflops": "samples/s per device x counted FLOPs per sample (FlopCounterMode, forward + backward) / 1e12",
    "explanation": "below --threshold efficiency: the part whose median grew most from 1 to N ranks is named",
}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _entry(launch: dict[str, Any]) -> dict[str, Any]:
    ranks = launch["ranks"]
    repeats = sorted({s["repeat"] for s in ranks[0]["steps"]})
    sps, per_rank = [], []
    for r in repeats:
        windows = [[s for s in rank["steps"] if s["repeat"] == r] for rank in ranks]
        seconds = [sum(s["step"] for s in w) for w in windows]
        sps.append(sum(s["samples"] for w in windows for s in w) / max(seconds))
        per_rank.append([sum(s["samples"] for s in w) / t for w, t in zip(windows, seconds, strict=True)])
    steps = [s for rank in ranks for s in rank["steps"]]
    for s in steps:
        s["other"] = s["step"] - sum(s.get(p, 0.0) for p in PARTS[:-1])
    ms = {p: 1000 * _median([s.get(p, 0.0) for s in steps]) for p in (*PARTS, "step", "allreduce_in_flight")}
    return {
        "ranks": len(ranks),
        "samples_per_s": _median(sps),
        "samples_per_s_min": min(sps),
        "samples_per_s_max": max(sps),
        "samples_per_s_windows": sps,
        "per_rank_samples_per_s": [_median([w[i] for w in per_rank]) for i in range(len(ranks))],
        "measured_steps_per_rank": len(ranks[0]["steps"]),
        "step_ms": ms["step"],
        "parts_ms": {p: ms[p] for p in PARTS},
        "allreduce_in_flight_ms": ms["allreduce_in_flight"],
        "devices": sorted({rank["device"] for rank in ranks}),
    }


def summarize(
    launches: dict[int, dict[str, Any]], flops_per_sample: int, threshold: float
) -> list[dict[str, Any]]:
    """One entry per rank count, with efficiency, TFLOPS per device and, below threshold, what grew."""
    entries = [_entry(launches[n]) for n in sorted(launches)]
    base = entries[0]
    for e in entries:
        n = e["ranks"]
        e["efficiency"] = e["samples_per_s"] / (n * base["samples_per_s"])
        e["tflops_per_device"] = e["samples_per_s"] / n * flops_per_sample / 1e12
        growth = {p: e["parts_ms"][p] - base["parts_ms"][p] for p in PARTS}
        e["growth_ms"] = growth
        e["grew"], e["explanation"] = None, None
        if n > 1 and e["efficiency"] < threshold:
            part = max(growth, key=lambda p: growth[p])
            e["grew"] = part
            compute = sum(growth[p] for p in ("forward", "backward", "optimizer"))
            inputs = growth["data_wait"] + growth["prepare"]
            before, after = base["parts_ms"][part], e["parts_ms"][part]
            e["explanation"] = (
                f"efficiency {e['efficiency']:.1%} < {threshold:.0%}: the step went from "
                f"{base['step_ms']:.1f} to {e['step_ms']:.1f} ms; {part} grew most "
                f"({before:.1f} -> {after:.1f} ms, {growth[part]:+.1f}); compute (fwd+bwd+optimizer) "
                f"{compute:+.1f} ms, communication (allreduce) {growth['allreduce']:+.1f} ms, "
                f"input (data_wait+prepare) {inputs:+.1f} ms"
            )
    return entries


def chart(path: Path, results: list[dict[str, Any]]) -> None:
    """Global samples/s against ranks beside perfect scaling, and each rank count's step split into its
    parts (median ms), so a reader sees what grew."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = [e["ranks"] for e in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    sps = [e["samples_per_s"] for e in results]
    spread = [[v - e["samples_per_s_min"] for v, e in zip(sps, results, strict=True)],
              [e["samples_per_s_max"] - v for v, e in zip(sps, results, strict=True)]]  # fmt: skip
    left.errorbar(ranks, sps, yerr=spread, fmt="o-", capsize=3, label="measured (median, min-max)")
    left.plot(ranks, [n * sps[0] for n in ranks], ":", color="grey", label="perfect: N x one rank")
    for n, value, e in zip(ranks, sps, results, strict=True):
        left.annotate(f"{e['efficiency']:.0%}", (n, value), textcoords="offset points", xytext=(6, -12))
    left.set_xticks(ranks)
    left.set_xlabel("ranks")
    left.set_ylabel("global samples/s (labels: efficiency)")
    left.legend(fontsize=8)
    bottom = [0.0] * len(results)
    for part in PARTS:
        values = [e["parts_ms"][part] for e in results]
        right.bar([str(n) for n in ranks], values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set_xlabel("ranks")
    right.set_ylabel("median ms per step, by part")
    right.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def notes(cuda: bool, hardware: Mapping[str, Any]) -> list[str]:
    """What the numbers can and cannot say on this machine."""
    if cuda:
        return ["one rank per GPU (NCCL); each part ends with torch.cuda.synchronize, which adds a little"]
    cores = hardware.get("cores_usable") or hardware.get("cores_logical")
    return [
        f"CPU only ({cores} usable cores): ranks (and their DataLoader workers) share the cores, so"
        " efficiency below 100% measures contention for cores and memory bandwidth more than"
        " communication; a part that 'grew' here is mostly a part that got fewer cycles",
        "gloo all-reduces through loopback TCP on the same machine: no network in the numbers",
    ]


def quick_line(launch: dict[str, Any], batch_size: int) -> str:
    e = _entry(launch)
    return f"{e['samples_per_s']:,.0f} samples/s, step {e['step_ms']:.1f} ms (batch {batch_size}/rank)"


COLUMNS = ("ranks", "samples/s", "spread", "efficiency", "TFLOPS/dev", "step ms", *PARTS)


def _rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = [[c.replace("_", " ") for c in COLUMNS]]
    for e in results:
        rows.append(
            [
                str(e["ranks"]),
                f"{e['samples_per_s']:,.0f}",
                f"{e['samples_per_s_min']:,.0f}-{e['samples_per_s_max']:,.0f}",
                f"{e['efficiency']:.0%}",
                f"{e['tflops_per_device']:.4f}",
                f"{e['step_ms']:.2f}",
                *(f"{e['parts_ms'][p]:.2f}" for p in PARTS),
            ]
        )
    return rows


def table(results: list[dict[str, Any]]) -> str:
    return "\n".join(["", "weak scaling (part columns: median ms per step)", *aligned(_rows(results))])


def result_lines(meta: dict[str, Any], results: list[dict[str, Any]], heading: str) -> list[str]:
    """The table, what grew below the threshold, and the notes on what this machine can show."""
    return [
        "Part columns: median ms per step.",
        "",
        *markdown_table(_rows(results)),
        "",
        *(f"- {e['ranks']} ranks: {e['explanation']}" for e in results if e["explanation"]),
        "",
        f"{heading} Notes",
        "",
        *(f"- {n}" for n in meta["notes"]),
    ]


def markdown(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    p, m = meta["parameters"], meta["model"]
    source = (
        "synthetic in-memory batches"
        if p["synthetic"]
        else f"packed tar, {meta['data']['num_samples']:,} samples"
    )
    lines = [
        "# shardpipe weak-scaling benchmark",
        "",
        f"{measured_on(meta['created'], meta['hardware'])}; backend {meta['backend']}; {source}; "
        f"batch {p['batch_size']} per rank, "
        f"{p['workers']} worker(s) and {p['threads']} thread(s) per rank; MLP {m['input_bytes']}-"
        f"{'-'.join([str(m['hidden'])] * m['layers'])}-10 ({m['parameters']:,} parameters, "
        f"{m['flops_per_sample'] / 1e6:.2f} MFLOP/sample fwd+bwd); warm-up {p['warmup']} steps, "
        f"{p['repeats']} windows of {p['steps']} steps.",
        "",
        *result_lines(meta, results, "##"),
    ]
    lines += ["", "## Rules", "", *[f"- **{k}**: {v}" for k, v in meta["rules"].items()]]
    for title, key in (
        ("Model", "model"),
        ("Data", "data"),
        ("Parameters", "parameters"),
        ("Versions", "versions"),
    ):
        lines += ["", f"## {title}", "", "```json", json.dumps(meta[key], indent=1), "```"]
    return "\n".join(lines) + "\n"
