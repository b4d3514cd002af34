"""``python -m bench.transfer``: every transport delivers every batch, and the report has them all (the ring
itself is tested in tests/test_transport.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.common.docs_page import read_section
from bench.transfer.measure import FLOOR_BATCH, TRANSPORTS, loader_for, make_batch

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]


def _plain(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch as comparable values: tensors and ragged bytes as lists."""
    return {name: value.tolist() if hasattr(value, "tolist") else value for name, value in batch.items()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_transport_delivers_every_batch_through_real_workers(transport: str) -> None:
    """Each worker's batches arrive, all of them, byte for byte as the worker made them."""
    batch_size, sample_bytes = FLOOR_BATCH if transport == "floor" else (8, 256)
    made = [_plain(make_batch(batch_size, sample_bytes, seed=worker)) for worker in range(2)]
    assert made[0] != made[1]  # the workers' batches differ, so each arrival names its worker
    received = [_plain(batch) for batch in loader_for(transport, 8, 256, count=41, workers=2)]
    assert len(received) == 41
    assert all(batch in made for batch in received)
    assert [made.index(batch) for batch in received].count(0) == 21  # worker 0 yields the odd one


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
        "--docs",
        str(tmp_path / "docs" / "benchmarks.md"),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    section = read_section((tmp_path / "docs" / "benchmarks.md").read_text(), "bench-transfer") or ""
    assert section.startswith("## bench-transfer: moving batches from workers to the trainer\n")
    assert (
        "| --sizes | 1024,4096 |" in section and "| ring_slots | " in section and "- **floor**: " in section
    )
    assert "| 4,096 | ring | " in section and "- 1,024 B samples: the ring " in section
    assert (
        section.rstrip().endswith("(img/bench-transfer.png)") and (tmp_path / "transfer.png").stat().st_size
    )
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


def _run(*command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def test_docs_page_another_benchmark_adds_its_section_and_a_rerun_replaces_only_its_own(
    tmp_path: Path,
) -> None:
    """Two benchmarks share one page: each run touches its own section only, and the order is fixed."""
    page = tmp_path / "benchmarks.md"
    tiny = ("--bytes-per-run", "100000", "--repeats", "1", "--calls", "2", "--warmup", "1")
    _run("bench.transfer", "--sizes", "1024", *tiny, "--out", str(tmp_path / "t1"), "--docs", str(page))
    transfer = read_section(page.read_text(), "bench-transfer")
    assert transfer is not None and "| 1,024 | ring | " in transfer
    scaling_args = ("--synthetic", "--max-ranks", "1", "--warmup", "1", "--steps", "2", "--repeats", "1")
    _run("bench.scaling", *scaling_args, "--out", str(tmp_path / "s"), "--docs", str(page))
    text = page.read_text()
    scaling = read_section(text, "bench-scaling")
    assert read_section(text, "bench-transfer") == transfer and scaling is not None
    assert text.index("<!-- bench-scaling:end -->") < text.index("<!-- bench-transfer:begin -->")
    _run("bench.transfer", "--sizes", "2048", *tiny, "--out", str(tmp_path / "t2"), "--docs", str(page))
    rerun = page.read_text()
    again = read_section(rerun, "bench-transfer")
    assert again is not None and "| 2,048 | ring | " in again and "| 1,024 | ring | " not in again
    assert read_section(rerun, "bench-scaling") == scaling
    assert rerun == text.replace(transfer, again) and rerun.count("<!-- bench-transfer:begin -->") == 1
