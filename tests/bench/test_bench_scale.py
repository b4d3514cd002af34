"""``python -m bench.scale``: a plan-only case of each kind measures what it says, and the report judges
and draws them (the full grid's scales are the benchmark's, not a test's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scale import plans, report

pytestmark = pytest.mark.bench


def test_plan_cases_measure_a_workers_first_window_and_the_report_judges_them(tmp_path: Path) -> None:
    cases = [
        plans.Case("layout-3", 10**6, 1, 8),
        plans.Case("layout-2", 10**6, 1, 8),
        plans.Case("layout-3", 10**7, 3, 1024),
    ]
    results = []
    for case in cases:
        timed, traced = plans.measure(case, traced=False), plans.measure(case, traced=True)
        assert timed["window_samples"] == traced["window_samples"] > 0  # the same window, located whole
        results.append({**timed, **traced})
    assert results[0]["window_samples"] == 1024  # a full window of the last worker of the last rank
    assert results[0]["peak_mb"] < results[1]["peak_mb"]  # layout 2 writes the worker's part out
    found = report.targets(results, [])
    assert [t["target"].split(" <=")[0] for t in found[:2]] == [
        "plan-only first window",
        "plan-only peak memory",
    ]
    lines = report.result_lines(results, [], found)
    assert any("layout-2" in line and "dataset" in line for line in lines)
    report.chart(tmp_path / "scale.png", results)
    assert (tmp_path / "scale.png").stat().st_size > 0


def test_the_last_worker_holding_samples_is_planned() -> None:
    """World 1,024 over 10^6 samples: 977 a rank, four batches of 256, so workers 4..7 hold none."""
    assert plans.last_worker(10**6, 1024) == 3
    assert plans.last_worker(10**8, 8) == plans.WORKERS - 1
