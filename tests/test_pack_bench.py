"""The pack benchmark: the quick run end to end (every contender, both profiles), and, on a fake clock,
that rounds, paired ratios and targets come out of the times as the issue defines them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import bench.pack_bench as pack_bench
from bench.docs_page import read_section
from bench.pack_bench import (
    FORMATS,
    SHARDWRITER,
    SHARDWRITER_SCRIPT,
    TAR,
    TAR_FSYNC,
    Contender,
    Profile,
    check_output,
    paired_ratio,
    targets,
    time_profile,
)

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
CONTENDERS = {
    TAR,
    TAR_FSYNC,
    SHARDWRITER,
    SHARDWRITER_SCRIPT,
    *(f"shardpipe {f}" for f in FORMATS),
    *(f"shardpipe {f} (in-process)" for f in FORMATS),
}


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    base = tmp_path_factory.mktemp("pack_bench")
    out = base / "out"
    command = [sys.executable, "-m", "bench.pack_bench", "--quick", "--out", str(out), "--cache", str(base)]
    command += ["--docs", str(out / "docs" / "benchmarks.md")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads((out / "report.json").read_text()), done.stdout, out


def test_docs_section_holds_the_settings_rules_and_tables(quick: tuple[dict[str, Any], str, Path]) -> None:
    report, _, out = quick
    section = read_section((out / "docs" / "benchmarks.md").read_text(), "bench-pack")
    assert section is not None and section.startswith("## bench-pack: pack throughput\n")
    assert "`python -m bench.pack_bench --quick --out " in section and "**A `--quick` smoke run" in section
    assert (
        "| --small | 3000 |" in section and "| --workers | 2 |" in section and "| profile small | " in section
    )
    assert f"tar {report['versions']['tar']}" in section
    assert "- **paired**: " in section and "- **spread**: " in section
    for row in report["results"]:
        assert f"| {row['profile']} | {row['contender']} | " in section
    for target in report["targets"]:
        assert f"| {target['profile']} | {target['target']} | " in section
    assert "](img/" not in section  # the pack benchmark draws no plot


def test_quick_run_times_every_contender_and_judges_every_target(
    quick: tuple[dict[str, Any], str, Path],
) -> None:
    report, stdout, out = quick
    for profile in ("small", "large"):
        assert {r["contender"] for r in report["results"] if r["profile"] == profile} == CONTENDERS
    names = [t["target"] for t in report["targets"]]
    assert len(names) == 2 * (len(FORMATS) + 1)
    assert "shardpipe tar >= 6x webdataset ShardWriter (script)" in names
    assert "shardpipe tar >= 1.5x webdataset ShardWriter (script)" in names
    assert all(t["met"] == (t["value"] >= t["threshold"]) for t in report["targets"])
    text = (out / "report.md").read_text()
    assert text.startswith("# shardpipe pack benchmark") and "ceiling" not in text
    assert all(name in stdout for name in CONTENDERS)
    assert report["costs"]["cli_startup_s"] > 0 and report["parameters"]["repeats"] == 1


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def _fake(name: str, clock: FakeClock, seconds: list[float], profile: Profile) -> Contender:
    """A contender that takes ``seconds[round]`` on the fake clock and leaves a plausible output."""
    calls = iter(seconds)

    def run(tree: Path, out: Path) -> None:
        clock.now += next(calls)
        if name.startswith("shardpipe"):
            (out / "ds").mkdir()
            shards = [{"samples": profile.num_samples}]
            (out / "ds" / "manifest.json").write_text(json.dumps({"splits": {"train": {"shards": shards}}}))
        else:
            (out / "all.tar").write_bytes(bytes(profile.payload_bytes + 512 * profile.num_samples))

    return Contender(name, "fake", run)


def test_rounds_paired_ratios_and_targets_on_a_fake_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(pack_bench.time, "perf_counter", clock.perf_counter)
    monkeypatch.setattr(pack_bench.os, "sync", lambda: None)
    profile = Profile("small", 10, 100)
    seconds = {
        TAR: [1.0, 2.0, 1.0],  # the machine slows down in round 2: paired ratios cancel it
        "shardpipe tar": [2.0, 4.0, 2.0],
        "shardpipe lmdb": [2.5, 5.0, 1.5],
        SHARDWRITER_SCRIPT: [13.0, 20.0, 11.0],
    }
    entries = [_fake(name, clock, times, profile) for name, times in seconds.items()]
    rows = time_profile(profile, tmp_path, tmp_path / "work", entries, repeats=3, log=False)
    by_name = {r["contender"]: r for r in rows}
    assert by_name["shardpipe lmdb"]["seconds"] == [2.5, 5.0, 1.5]  # rotation kept each one's own times
    assert by_name["shardpipe tar"]["paired_ratio_to_tar"] == pytest.approx(0.5)
    assert by_name["shardpipe tar"]["median_s"] == 2.0
    found = {t["target"]: (t["value"], t["met"]) for t in targets(rows)}
    assert found == {
        "shardpipe tar >= 0.5x tar cf": (pytest.approx(0.5), True),
        "shardpipe lmdb >= 0.5x tar cf": (pytest.approx(0.4), False),  # median of 0.4, 0.4, 0.667
        "shardpipe tar >= 6x webdataset ShardWriter (script)": (pytest.approx(5.5), False),
    }
    large = [{**r, "profile": "large"} for r in rows]
    assert {t["target"]: t["met"] for t in targets(large)}[
        "shardpipe tar >= 1.5x webdataset ShardWriter (script)"
    ]


def test_paired_ratio_is_the_median_of_per_round_ratios() -> None:
    assert paired_ratio([1.0, 2.0, 4.0], [2.0, 2.0, 2.0]) == 1.0
    with pytest.raises(ValueError):
        paired_ratio([1.0], [1.0, 2.0])


def test_check_output_refuses_a_packer_that_dropped_samples(tmp_path: Path) -> None:
    profile = Profile("small", 10, 100)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "manifest.json").write_text(
        json.dumps({"splits": {"train": {"shards": [{"samples": 9}]}}})
    )
    with pytest.raises(RuntimeError, match="expected 10 samples, 9 samples"):
        check_output(Contender("shardpipe tar", "cli", lambda tree, out: None), tmp_path, profile)
    (tmp_path / "all.tar").write_bytes(bytes(100))
    with pytest.raises(RuntimeError, match="100 bytes of tar"):
        check_output(Contender(TAR, "baseline", lambda tree, out: None), tmp_path, profile)
