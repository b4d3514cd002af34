"""``python -m bench.scaling --quick`` end to end: report structure and internal consistency, not speed."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.common.docs_page import read_section
from bench.scaling.report import PARTS

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]
MAX_RANKS = min(2, torch.cuda.device_count()) if torch.cuda.is_available() else 2  # one rank per GPU


def run_bench(out: Path, *extra: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.scaling", "--quick", "--out", str(out)]
    command += ["--max-ranks", str(MAX_RANKS), *extra]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "weak scaling" in done.stdout and "efficiency" in done.stdout  # the terminal table
    assert (out / "report.md").read_text().startswith("# shardpipe weak-scaling benchmark")
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return report


@pytest.fixture(scope="module")
def loader_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """The loader run, and the docs page it wrote."""
    base = tmp_path_factory.mktemp("scaling")
    page = base / "docs" / "benchmarks.md"
    return run_bench(base / "out", "--docs", str(page)), page


@pytest.fixture(scope="module")
def report(loader_run: tuple[dict[str, Any], Path]) -> dict[str, Any]:
    return loader_run[0]


@pytest.fixture(scope="module")
def synthetic_run(
    tmp_path_factory: pytest.TempPathFactory, loader_run: tuple[dict[str, Any], Path]
) -> tuple[dict[str, Any], Path, str]:
    """The synthetic run, written over a copy of the loader run's page (with a line of text after it)."""
    base = tmp_path_factory.mktemp("scaling-synthetic")
    page = base / "docs" / "benchmarks.md"
    page.parent.mkdir()
    before = loader_run[1].read_text() + "\nA line after the sections.\n"
    page.write_text(before)
    extra = ("--synthetic", "--warmup", "1", "--steps", "4", "--repeats", "2", "--docs", str(page))
    return run_bench(base / "out", *extra), page, before


@pytest.fixture(scope="module")
def synthetic(synthetic_run: tuple[dict[str, Any], Path, str]) -> dict[str, Any]:
    return synthetic_run[0]


def check_consistent(report: dict[str, Any]) -> None:
    params, results = report["parameters"], report["results"]
    assert [e["ranks"] for e in results] == list(range(1, MAX_RANKS + 1))
    base = results[0]
    assert base["efficiency"] == pytest.approx(1.0)
    for e in results:
        n = e["ranks"]
        assert e["efficiency"] == pytest.approx(e["samples_per_s"] / (n * base["samples_per_s"]))
        flops = report["model"]["flops_per_sample"]
        assert e["tflops_per_device"] == pytest.approx(e["samples_per_s"] / n * flops / 1e12)
        windows = e["samples_per_s_windows"]
        assert len(windows) == params["repeats"]
        assert e["samples_per_s"] == pytest.approx(statistics.median(windows))
        assert e["samples_per_s_min"] <= e["samples_per_s"] <= e["samples_per_s_max"]
        assert len(e["per_rank_samples_per_s"]) == n
        assert e["measured_steps_per_rank"] == params["steps"] * params["repeats"]
        assert set(e["parts_ms"]) == set(PARTS)
        assert all(v >= -1e-3 for v in e["parts_ms"].values()) and e["step_ms"] > 0
        for part in PARTS:
            assert e["growth_ms"][part] == pytest.approx(e["parts_ms"][part] - base["parts_ms"][part])
        if n > 1 and e["efficiency"] < params["threshold"]:
            assert e["grew"] == max(PARTS, key=lambda p: e["growth_ms"][p])
            assert f"{e['grew']} grew most" in e["explanation"]
        else:
            assert e["grew"] is None and e["explanation"] is None


def test_loader_run_is_consistent(report: dict[str, Any]) -> None:
    check_consistent(report)
    assert report["data"]["num_samples"] >= MAX_RANKS * 64 * (3 + 15 * 3)
    assert len(report["data"]["fingerprint"]) == 16


def test_synthetic_run_is_consistent(synthetic: dict[str, Any]) -> None:
    check_consistent(synthetic)
    assert synthetic["data"]["synthetic"] is True and synthetic["parameters"]["synthetic"] is True


def test_report_records_what_makes_results_comparable(report: dict[str, Any]) -> None:
    assert report["hardware"]["cpu"] and report["versions"]["torch"]
    assert report["backend"] == ("nccl" if report["device"] == "cuda" else "gloo")
    for key in ("batch_size", "warmup", "steps", "repeats", "workers", "threads", "hidden", "layers"):
        assert key in report["parameters"]
    model = report["model"]
    assert 0 < model["flops_per_sample"] <= model["flops_per_sample_analytic"]
    assert {"warmup", "window", "repeats", "efficiency", "tflops", "parts"} <= set(report["rules"])
    assert report["notes"]
    if report["device"] == "cpu":
        assert "share the cores" in report["notes"][0]


def test_docs_section_holds_the_settings_rules_and_table(loader_run: tuple[dict[str, Any], Path]) -> None:
    report, page = loader_run
    section = read_section(page.read_text(), "bench-scaling")
    assert section is not None and section.startswith("## bench-scaling: weak scaling\n")
    assert "`python -m bench.scaling --quick --out " in section
    assert f"| --max-ranks | {MAX_RANKS} |" in section and "| --steps | 15 |" in section
    assert f"| backend | {report['backend']} |" in section and "| model | `{" in section
    assert "- **efficiency**: " in section and "- **repeats**: " in section
    for entry in report["results"]:
        assert f"| {entry['ranks']} | {entry['samples_per_s']:,.0f} | " in section
    assert section.rstrip().endswith("(img/bench-scaling.png)")


def test_a_rerun_replaces_its_section_and_nothing_else(
    synthetic_run: tuple[dict[str, Any], Path, str],
) -> None:
    _, page, before = synthetic_run
    text = page.read_text()
    old, new = read_section(before, "bench-scaling"), read_section(text, "bench-scaling")
    assert old is not None and new is not None and old != new
    assert text == before.replace(old, new) and text.count("<!-- bench-scaling:begin -->") == 1
    assert "--synthetic" in new.splitlines()[2] and "| --synthetic | True |" in new
    assert "--synthetic" not in old.splitlines()[2]
