"""``python -m bench.transfer``: every transport delivers every batch, and the report has them all (the ring
itself is tested in tests/test_transport.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.transfer.measure import TRANSPORTS, run_once

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_transport_delivers_every_batch_through_real_workers(transport: str) -> None:
    assert run_once(transport, batch_size=8, sample_bytes=256, batches=40, warmup=3, workers=2) > 0


def test_report(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "bench.transfer",
        "--quick",
        "--sizes",
        "1024,4096",
        "--bytes-per-run",
        "500000",
        "--repeats",
        "2",
        "--calls",
        "5",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert [(e["sample_bytes"], e["transport"]) for e in report["results"]] == [
        (size, t) for size in (1024, 4096) for t in TRANSPORTS
    ]
    for e in report["results"]:
        assert len(e["runs"]) == 2 and e["batches_per_s_min"] <= e["batches_per_s"] <= e["batches_per_s_max"]
        if e["transport"] != "floor":
            assert e["mb_per_s"] == pytest.approx(e["batches_per_s"] * e["sample_bytes"] * 64 / 1e6)
        assert e["components"]["pickled_bytes"] > 64 * e["sample_bytes"] * 0.75
        if e["transport"] == "pipe-1m":
            assert e["vs_pipe_1m"] == pytest.approx(1.0)
    assert all(e["components"]["ring_read_us"] > 0 for e in report["results"])
    assert len(report["recommendation"]) == 2 and "ring" in report["recommendation"][0]
    assert (tmp_path / "report.md").read_text().startswith("# shardpipe transfer benchmark")
