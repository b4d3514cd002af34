"""``bench.io.remote``: the loopback S3 benchmark helper runs end to end and counts the bytes it serves."""

from __future__ import annotations

import re

import pytest

from bench.io import remote

pytestmark = pytest.mark.bench


@pytest.mark.timeout(120)
def test_quick_run_fetches_each_shard_once_cold_and_nothing_warm(capsys: pytest.CaptureFixture[str]) -> None:
    remote.main(["--quick", "--latency-ms", "1", "--bandwidth-mbs", "0"])
    lines = capsys.readouterr().out.splitlines()
    fetched = {line.split(":")[0]: float(re.findall(r"([\d.]+) MB fetched", line)[0]) for line in lines}
    dataset_mb = 8 * (2 << 20) / 1e6
    assert fetched["prefetch=0 cold"] == pytest.approx(dataset_mb, abs=0.1)
    assert fetched["prefetch=2 cold"] == pytest.approx(dataset_mb, abs=0.1)
    assert fetched["prefetch=0 warm"] == 0 and fetched["prefetch=2 warm"] == 0
