"""``python -m bench.pack_bench --quick`` end to end: report structure and consistency, not speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.pack_bench import FORMATS, SHARDWRITER, SHARDWRITER_SCRIPT, TAR, TAR_FSYNC

ROOT = Path(__file__).resolve().parents[1]
CONTENDERS = {
    TAR,
    TAR_FSYNC,
    SHARDWRITER,
    SHARDWRITER_SCRIPT,
    *(f"shardpipe {f}" for f in FORMATS),
    *(f"shardpipe {f} (in-process)" for f in FORMATS),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    base = tmp_path_factory.mktemp("pack_bench")
    out = base / "out"
    command = [sys.executable, "-m", "bench.pack_bench", "--quick", "--out", str(out), "--cache", str(base)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads((out / "report.json").read_text()), done.stdout, out


def test_every_contender_in_every_profile(run: tuple[dict[str, Any], str, Path]) -> None:
    report, stdout, out = run
    for profile in ("small", "large"):
        names = {r["contender"] for r in report["results"] if r["profile"] == profile}
        assert names == CONTENDERS
    assert (out / "report.md").read_text().startswith("# shardpipe pack benchmark")
    for name in CONTENDERS:
        assert name in stdout
    assert report["machine"]["cpu"] and report["machine"]["cores_logical"] >= 1
    assert report["versions"]["webdataset"] != "not installed"
    assert report["parameters"]["quick"] and report["parameters"]["repeats"] == 1


def test_numbers_are_consistent(run: tuple[dict[str, Any], str, Path]) -> None:
    report = run[0]
    for profile, params in report["parameters"]["profiles"].items():
        rows = [r for r in report["results"] if r["profile"] == profile]
        tar = next(r for r in rows if r["contender"] == TAR)
        assert tar["ratio_to_tar"] == pytest.approx(1.0)
        for r in rows:
            assert r["samples"] == params["num_samples"]
            assert r["payload_bytes"] == params["num_samples"] * params["sample_bytes"]
            assert len(r["seconds"]) == 1
            assert r["min_s"] <= r["median_s"] <= r["max_s"]
            assert r["samples_per_s"] == pytest.approx(r["samples"] / r["median_s"])
            assert r["mb_per_s"] == pytest.approx(r["payload_bytes"] / 1e6 / r["median_s"])
            assert r["ratio_to_tar"] == pytest.approx(r["samples_per_s"] / tar["samples_per_s"])
            assert r["paired_ratio_to_tar"] == pytest.approx(tar["seconds"][0] / r["seconds"][0])


def test_targets_follow_the_paired_times(run: tuple[dict[str, Any], str, Path]) -> None:
    report = run[0]
    assert len(report["targets"]) == 2 * (len(FORMATS) + 2)
    seconds = {(r["profile"], r["contender"]): r["seconds"][0] for r in report["results"]}
    rows = {(r["profile"], r["contender"]): r for r in report["results"]}
    costs = report["costs"]
    assert costs["sha256_bytes_per_s"] > 0 and costs["cli_startup_s"] > 0
    assert costs["cores"] == report["parameters"]["workers"]
    pairs = {SHARDWRITER_SCRIPT: ("shardpipe tar", True), SHARDWRITER: ("shardpipe tar (in-process)", False)}
    for t in report["targets"]:
        p = t["profile"]
        peer = next((name for name in pairs if t["target"].endswith(name)), None)
        if peer is not None:
            ours, cli = pairs[peer]
            assert t["target"].startswith(f"{ours} >= ")
            expected = seconds[p, peer] / seconds[p, ours]
            hash_s = rows[p, TAR]["payload_bytes"] / costs["sha256_bytes_per_s"]
            assert t["ceiling"] == pytest.approx(seconds[p, peer] * costs["cores"] / hash_s)
            floor = (hash_s + rows[p, TAR]["cpu_s"]) / costs["cores"] + (costs["cli_startup_s"] if cli else 0)
            assert t["ceiling_estimate"] == pytest.approx(seconds[p, peer] / floor)
            assert t["ceiling_estimate"] < t["ceiling"]
        else:
            fmt = t["target"].split()[1]
            expected = seconds[p, TAR] / seconds[p, f"shardpipe {fmt}"]
        assert t["value"] == pytest.approx(expected)
        assert t["met"] == (t["value"] >= t["threshold"])
