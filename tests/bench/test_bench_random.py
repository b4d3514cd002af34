"""``python -m bench.io --profile random --quick`` end to end: every reader measured, the remote counts
as the design says (about one request per sample, bytes near the sample plus its index share), not speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common.docs_page import read_section

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_quick_random_run_reports_every_reader_and_the_remote_counts(tmp_path: Path) -> None:
    out, page = tmp_path / "out", tmp_path / "docs" / "benchmarks.md"
    command = [sys.executable, "-m", "bench.io", "--profile", "random", "--quick", "--latency-ms", "1"]
    done = subprocess.run(
        [*command, "--out", str(out), "--docs", str(page)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    readers = {"raw-files", "lmdb-txn-get"} | {
        f"shardpipe-{f}{b}" for f in ("tar", "lmdb", "tfrecord", "tar-nocheck") for b in ("", "@64")
    }
    for profile in ("small", "large"):
        assert set(report["local"][profile]) == readers
        assert all(rate > 0 for rate in report["local"][profile].values())
        remote = report["remote"][profile]
        for name in ("shardpipe-tar", "shardpipe-tar@64"):
            # one ranged request per sample, plus each touched shard's index once
            assert 1 <= remote[name]["requests_per_sample"] <= 2
            needed = remote[name]["stored_bytes_per_sample"] + remote[name]["index_bytes_per_sample"]
            assert remote[name]["bytes_per_sample"] <= 2 * needed
        assert remote["download-shard"]["bytes_per_sample"] > 2 * remote["shardpipe-tar"]["bytes_per_sample"]
    section = read_section(page.read_text(), "bench-io-random")
    assert section is not None and "**Remote, small profile**" in section
