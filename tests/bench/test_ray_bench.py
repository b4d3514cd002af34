"""``python -m bench.pack.ray`` at a tiny size, as a subprocess: both engines timed, every cost reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_ray_pack_bench_reports_both_engines_and_the_costs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "bench.pack.ray", "--small", "300", "--large", "40", "--repeats", "2",
        "--out", str(out), "--cache", str(tmp_path / "cache"),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    rows = {(r["profile"], r["engine"]): r for r in report["pack"]}
    assert set(rows) == {(p, e) for p in ("small", "large") for e in ("local pool", "ray")}
    assert all(len(r["seconds"]) == 2 and r["shards"] == 8 for r in rows.values())
    assert rows["small", "ray"]["samples"] == 300
    costs = report["costs"]
    timed = ("ray.init start_s", "ray no-op task ms", "small listing files/s, ray", "cluster head start_s")
    for key in timed:
        assert costs[key] > 0, key
    assert costs["cluster head processes"] >= 2 and costs["cluster second processes"] >= 2
    assert "| small | ray | 8 |" in (out / "report.md").read_text()
