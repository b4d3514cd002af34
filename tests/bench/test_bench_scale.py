"""``python -m bench.scale``: a plan-only case of each kind measures what it says, and the report judges
and draws them (the full grid's scales are the benchmark's, not a test's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scale import manifests, plans, report

pytestmark = pytest.mark.bench


def test_plan_cases_measure_a_workers_first_window_and_the_report_judges_them(tmp_path: Path) -> None:
    cases = [
        plans.Case("layout-3", 10**6, 1, 8),
        plans.Case("layout-2", 10**6, 1, 8),
        plans.Case("layout-3", 10**7, 3, 1024),
        plans.Case("grain", 10**6, 1, 8),
    ]
    results = []
    for case in cases:
        timed, traced = plans.measure(case, traced=False), plans.measure(case, traced=True)
        assert timed["window_samples"] == traced["window_samples"] > 0  # the same window, located whole
        results.append({**timed, **traced})
    assert results[0]["window_samples"] == results[3]["window_samples"] == 1024  # the last worker's first
    assert results[0]["peak_mb"] < results[1]["peak_mb"]  # layout 2 writes the worker's part out
    found = report.targets(results, [], [])
    assert [t["target"].split(" <=")[0] for t in found[:2]] == [
        "plan-only first window",
        "plan-only peak memory",
    ]
    lines = report.result_lines(results, [], [], found)
    assert any("layout-2" in line and "dataset" in line for line in lines)
    assert any(line.startswith("| grain") for line in lines)
    report.chart(tmp_path / "scale.png", results)
    assert (tmp_path / "scale.png").stat().st_size > 0


def test_the_last_worker_holding_samples_is_planned() -> None:
    """World 1,024 over 10^6 samples: 977 a rank, four batches of 256, so workers 4..7 hold none."""
    assert plans.last_worker(10**6, 1024) == 3
    assert plans.last_worker(10**8, 8) == plans.WORKERS - 1


def test_a_manifest_case_loads_either_form_and_the_report_judges_the_table_file(tmp_path: Path) -> None:
    loads = [
        manifests.measure(str(manifests.prepare(tmp_path / str(listed), 3000, listed=listed)), 3000, listed)
        for listed in (False, True)
    ]
    assert [(load["form"], load["opened"][:6]) for load in loads] == [
        ("table file", "train/"),
        ("listed in JSON", "train/"),
    ]
    assert (tmp_path / "False" / "train.shards.arrow").exists()
    assert not (tmp_path / "True" / "train.shards.arrow").exists()
    loads[0]["shards"] = report.MANIFEST_SHARDS  # judged as the 10^6 case would be
    assert [t["target"].split(":")[0] for t in report.targets([], [], loads)] == ["manifest of 10^6 shards"]
    assert any("table file" in line for line in report.result_lines([], [], loads, []))
