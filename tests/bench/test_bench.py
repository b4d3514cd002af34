"""``python -m bench.io --quick`` end to end: the report's structure and internal consistency, not speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.common.docs_page import PREAMBLE, SECTIONS, read_section, replace_section
from bench.io.contenders import CLS_RAW, NAMES
from bench.io.data import QUICK_WINDOWS
from bench.io.targets import CLS_TARGET, READ_PATH_TARGETS, paired_ratio

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, Path]:
    """The quick run, with its report.json, its output folder and the docs page it wrote."""
    base = tmp_path_factory.mktemp("bench")
    out, page = base / "out", base / "docs" / "benchmarks.md"
    command = [sys.executable, "-m", "bench.io", "--quick", "--out", str(out), "--threshold", "0.1"]
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
    assert f"by `python -m bench.io --quick --out {out} --threshold 0.1 --docs {page}`." in section
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
    for profile, dataset in report["datasets"].items():
        assert len(dataset["fingerprint"]) == 16
        assert (dataset["warmup_steps"], dataset["measured_steps"]) == QUICK_WINDOWS[profile]
    for key in ("batch_size", "workers", "repeats", "warmup", "steps", "compute_ms", "cold"):
        assert key in report["parameters"]
    assert {"warmup", "window", "repeats", "verdict", "floor"} <= set(report["rules"])


def test_remote_mode_reads_through_the_loopback_s3_server(tmp_path: Path) -> None:
    """``--remote``: every remote contender runs, and the bytes each fetched say what the cache did: the
    cold cache fetched every shard once, the warm one only the manifest and indexes, the local ones none."""
    out, page = tmp_path / "out", tmp_path / "benchmarks.md"
    command = [sys.executable, "-m", "bench.io", "--quick", "--remote", "--out", str(out), "--cache",
               str(tmp_path / "data"), "--docs", str(page)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    text = page.read_text()
    assert read_section(text, "bench-io") is None  # its own section: the default run's stays
    section = read_section(text, "bench-io-remote") or ""
    assert "| --remote | True |" in section and "| s3-tar-cold | " in section
    assert section.rstrip().endswith("(img/bench-io-remote.png)")
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


def test_cls_rows_are_judged_against_their_raw_rows_and_the_lmdb_loop(quick: tuple[dict, Path, Path]) -> None:
    """Every format's -cls row against its raw-bytes row and against the hand-written lmdb-loop, per
    profile, on paired ratios (never speed)."""
    report, _, page = quick
    targets = {(t["profile"], t["contender"], t["baseline"]): t for t in report["targets"]}
    expected = {(p, c, b) for p in ("small", "large") for c in CLS_RAW for b in (CLS_RAW[c], "lmdb-loop")}
    assert set(targets) == expected
    by = {(e["profile"], e["contender"]): e for e in report["results"]}
    for (profile, contender, baseline), t in targets.items():
        threshold = CLS_TARGET if baseline != "lmdb-loop" else READ_PATH_TARGETS[(profile, 2)]
        ratio = (
            by[(profile, contender)]["runs"][0]["samples_per_s"]
            / by[(profile, baseline)]["runs"][0]["samples_per_s"]
        )
        assert t["value"] == pytest.approx(ratio)  # one round: the paired ratio is that round's
        assert t["met"] == (t["value"] >= threshold) and t["threshold"] == threshold
        assert t["target"] == f"{contender} >= {threshold:g}x {baseline} (W=2)"
    section = read_section(page.read_text(), "bench-io") or ""
    assert (
        "#### Targets" in section and "| small | shardpipe-tar-cls >= 0.9x shardpipe-tar (W=2) | " in section
    )
    assert "| large | shardpipe-lmdb-cls >= 1.2x lmdb-loop (W=2) | " in section


def test_cls_rows_decode_labels_on_the_batch_path() -> None:
    """``decode={"cls": "cls"}``: one int64 tensor per batch; the raw row keeps bytes; W=0 as well."""
    from bench.io import contenders, data
    from loaders.batches import RaggedBytes

    dataset = data.prepare(data.QUICK_PROFILES["small"], ROOT / "bench-results" / "cache", log=False)
    settings = contenders.LoaderSettings(batch_size=16, num_workers=0)
    for name in CLS_RAW:
        decoded, raw = (next(iter(contenders.build(n, dataset, settings))) for n in (name, CLS_RAW[name]))
        assert isinstance(decoded["cls"], torch.Tensor) and decoded["cls"].dtype == torch.int64
        assert decoded["cls"].shape == (16,) and isinstance(raw["cls"], RaggedBytes)
        assert isinstance(decoded["bin"], RaggedBytes)


def test_workers_0_run_judges_the_cls_targets_at_w0(tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = [sys.executable, "-m", "bench.io", "--quick", "--profile", "small", "--workers", "0",
               "--contenders", "shardpipe-tar,shardpipe-tar-cls", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (target,) = json.loads((out / "report.json").read_text())["targets"]
    assert target["target"] == "shardpipe-tar-cls >= 0.9x shardpipe-tar (W=0)" and target["workers"] == 0
    assert "shardpipe-tar-cls >= 0.9x shardpipe-tar (W=0)" in done.stdout


def test_paired_ratio_is_the_median_of_per_round_ratios() -> None:
    assert paired_ratio([100.0, 200.0, 50.0], [90.0, 100.0, 60.0]) == pytest.approx(0.9)
    assert paired_ratio([10.0], [5.0]) == 0.5
    with pytest.raises(ValueError):
        paired_ratio([1.0, 2.0], [1.0])  # rounds must pair up


def test_each_kind_of_run_has_its_section_after_the_default_one() -> None:
    page = replace_section(PREAMBLE, "bench-pack", "pack\n")
    for name in ("bench-io-cold", "bench-io", "bench-io-images", "bench-io-workers-0", "bench-io-remote"):
        page = replace_section(page, name, f"{name}\n")
    starts = [page.index(f"<!-- {n}:begin -->") for n in SECTIONS if f"<!-- {n}:begin -->" in page]
    assert starts == sorted(starts) and len(starts) == 6
    kinds = ("bench-io", "bench-io-workers-0", "bench-io-images", "bench-io-remote", "bench-io-cold")
    assert SECTIONS[:5] == kinds
    with pytest.raises(ValueError, match="expected one of"):
        replace_section(PREAMBLE, "bench-io-other", "x\n")


def test_transport_variants_are_accepted_but_not_run_by_default() -> None:
    from bench.io.__main__ import parse_args
    from bench.io.contenders import BUILDERS, VARIANTS

    assert parse_args(["--contenders", ",".join(VARIANTS)]).contenders == list(VARIANTS)
    assert set(VARIANTS) <= set(BUILDERS) and not set(VARIANTS) & set(NAMES)
    assert parse_args([]).contenders == list(NAMES)


def test_a_run_with_no_workers_has_its_own_section_and_other_counts_none() -> None:
    from bench.io.__main__ import _kind, parse_args

    assert _kind(parse_args([]))[0] == "bench-io"
    assert _kind(parse_args(["--workers", "0"]))[0] == "bench-io-workers-0"
    with pytest.raises(SystemExit, match="--workers 2 and 0"):
        _kind(parse_args(["--workers", "4"]))
