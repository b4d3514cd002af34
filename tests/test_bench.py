"""``python -m bench --quick`` end to end: the report's structure and internal consistency, not its speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.contenders import NAMES
from bench.docs_page import PREAMBLE, read_section

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, Path]:
    """The quick run, with its report.json, its output folder and the docs page it wrote."""
    base = tmp_path_factory.mktemp("bench")
    out, page = base / "out", base / "docs" / "benchmarks.md"
    command = [sys.executable, "-m", "bench", "--quick", "--out", str(out), "--threshold", "0.1"]
    done = subprocess.run(
        [*command, "--docs", str(page)], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert (out / "report.md").read_text().startswith("# shardpipe I/O benchmark")
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in NAMES:
        assert name in done.stdout  # the terminal table
    return json.loads((out / "report.json").read_text()), out, page


@pytest.fixture(scope="module")
def report(quick: tuple[dict, Path, Path]) -> dict:
    return quick[0]


def test_docs_section_records_the_run_and_its_tables(quick: tuple[dict, Path, Path]) -> None:
    report, out, page = quick
    text = page.read_text()
    assert text.startswith(PREAMBLE)
    section = read_section(text, "bench-io")
    assert section is not None
    assert f"by `python -m bench --quick --out {out} --threshold 0.1 --docs {page}`." in section
    assert report["hardware"]["cpu"] in section and f"torch {report['versions']['torch']}" in section
    assert "| --batch-size | 64 |" in section and "| --repeats | 1 |" in section
    assert "| --contenders | " + ",".join(NAMES) + " |" in section
    assert "- **warmup**: " in section and "- **repeats**: " in section
    for profile in ("small", "large"):
        assert f"#### {profile} profile" in section
    for name in NAMES:
        assert section.count(f"| {name} | ") == 2  # one row per profile
    assert section.rstrip().endswith("(img/bench-io.png)")
    assert (page.parent / "img" / "bench-io.png").read_bytes() == (out / "throughput.png").read_bytes()


def test_every_contender_in_every_profile(report: dict) -> None:
    groups = {(e["profile"], e["cache"]) for e in report["results"]}
    assert groups == {("small", "warm"), ("large", "warm")}
    for group in groups:
        names = [e["contender"] for e in report["results"] if (e["profile"], e["cache"]) == group]
        assert sorted(names) == sorted(NAMES)


def test_numbers_are_consistent(report: dict) -> None:
    threshold = report["parameters"]["threshold"]
    for e in report["results"]:
        sample_bytes = report["datasets"][e["profile"]]["mean_sample_bytes"]
        assert 0.75 * sample_bytes <= e["bytes_per_sample"] <= 1.25 * sample_bytes
        assert e["mb_per_s"] == pytest.approx(e["samples_per_s"] * e["bytes_per_sample"] / 1e6)
        assert e["samples_per_s_min"] <= e["samples_per_s"] <= e["samples_per_s_max"]
        assert 0.0 <= e["wait_fraction"] <= 1.0
        assert e["verdict"] == ("input-bound" if e["wait_fraction"] > threshold else "compute-bound")
        assert e["fraction_of_floor"] == pytest.approx(e["mb_per_s"] / e["floor_mb_per_s"])
        assert e["fraction_of_floor"] > 0 and e["fraction_of_in_memory"] > 0
        assert e["first_batch_s"] > 0 and e["peak_rss_mb"] > 0
        for run in e["runs"]:
            assert run["steps"] == report["datasets"][e["profile"]]["measured_steps"]
            assert run["samples"] <= run["steps"] * report["parameters"]["batch_size"]
            assert 0.0 <= run["wait_s"] <= run["seconds"]
        if e["contender"] == "in-memory":
            assert e["fraction_of_in_memory"] == pytest.approx(1.0)


def test_report_records_what_makes_results_comparable(report: dict) -> None:
    assert report["hardware"]["cpu"] and report["hardware"]["cores_logical"] >= 1
    assert {"torch", "webdataset", "shardpipe", "python"} <= set(report["versions"])
    for dataset in report["datasets"].values():
        assert len(dataset["fingerprint"]) == 16
        assert dataset["warmup_steps"] >= 0 and dataset["measured_steps"] >= 1
    for key in ("batch_size", "workers", "repeats", "warmup", "steps", "compute_ms", "cold"):
        assert key in report["parameters"]
    assert {"warmup", "window", "repeats", "verdict", "floor"} <= set(report["rules"])


def test_remote_mode_reads_through_the_loopback_s3_server(tmp_path: Path) -> None:
    """``--remote``: every remote contender runs, and the bytes each fetched say what the cache did: the
    cold cache fetched every shard once, the warm one only the manifest and indexes, the local ones none."""
    out, page = tmp_path / "out", tmp_path / "benchmarks.md"
    command = [sys.executable, "-m", "bench", "--quick", "--remote", "--out", str(out), "--cache",
               str(tmp_path / "data"), "--docs", str(page)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    section = read_section(page.read_text(), "bench-io") or ""
    assert "| --remote | True |" in section and "| s3-tar-cold | " in section
    assert "Loopback S3 server: 20 ms per request, 200 MB/s per response" in section
    results = {r["contender"]: r for r in json.loads((out / "report.json").read_text())["results"]}
    assert set(results) == {
        "local-tar-cold",
        "local-tar-warm",
        "s3-tar-cold",
        "s3-tar-warm",
        "webdataset-http",
    }
    shard_mb = sum(p.stat().st_size for p in (tmp_path / "data").rglob("*.tar")) / 1e6
    assert results["local-tar-cold"]["fetched_mb"] == [0.0]
    assert shard_mb <= results["s3-tar-cold"]["fetched_mb"][0] < 1.2 * shard_mb
    assert results["s3-tar-warm"]["fetched_mb"][0] < 0.2 * shard_mb


def test_transport_variants_are_accepted_but_not_run_by_default() -> None:
    from bench.__main__ import parse_args
    from bench.contenders import BUILDERS, VARIANTS

    assert parse_args(["--contenders", ",".join(VARIANTS)]).contenders == list(VARIANTS)
    assert set(VARIANTS) <= set(BUILDERS) and not set(VARIANTS) & set(NAMES)
    assert parse_args([]).contenders == list(NAMES)
