"""The pack benchmark: the quick run end to end (every contender, every profile), and, on a fake clock,
that rounds, paired ratios and targets come out of the times as the issue defines them; the image
profile's output check refuses what a wrong preparer would leave."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from PIL import Image

import bench.pack.__main__ as pack_main
import bench.pack.run as pack_run
from bench.common.docs_page import read_section
from bench.pack.checks import check_output, check_prepared
from bench.pack.contenders import (
    BARE_POOL,
    BARE_POOL_PLAIN,
    FLAT_PARQUET,
    FORMATS,
    HF_PARQUET,
    MAP_NOOP,
    PREPARED,
    PREPARED_IN_PROCESS,
    SHARDWRITER,
    SHARDWRITER_LOOP,
    SHARDWRITER_POOL,
    SHARDWRITER_SCRIPT,
    TAR,
    TAR_FSYNC,
    Contender,
)
from bench.pack.data import (
    FLAT_LIST,
    HF_FILE,
    HF_FOLDER,
    ParquetProfile,
    PhotoProfile,
    Profile,
    build_parquet,
)
from bench.pack.run import Workload, byte_workload, paired_ratio, time_profile
from bench.pack.targets import targets
from tests.bench.scripts import run_module

pytestmark = pytest.mark.bench
CONTENDERS = {
    TAR,
    TAR_FSYNC,
    SHARDWRITER,
    SHARDWRITER_SCRIPT,
    MAP_NOOP,
    *(f"shardpipe {f}" for f in FORMATS),
    *(f"shardpipe {f} (in-process)" for f in FORMATS),
}
IMAGE_CONTENDERS = {
    BARE_POOL,
    BARE_POOL_PLAIN,
    PREPARED,
    PREPARED_IN_PROCESS,
    SHARDWRITER_LOOP,
    SHARDWRITER_POOL,
}
MAP_TARGET = f"{MAP_NOOP}: time <= 1.15x shardpipe tar (no map)"
IMAGE_TARGETS = {f"{PREPARED} >= 0.9x {BARE_POOL}", f"{PREPARED} >= 1.8x {SHARDWRITER_LOOP}"}
PARQUET_TARGET = f"{HF_PARQUET} >= 0.8x {FLAT_PARQUET}"


def _judged(target: dict[str, Any]) -> bool:
    at_most = target["rule"] == "<="
    return bool(target["value"] <= target["threshold"] if at_most else target["value"] >= target["threshold"])


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    base = tmp_path_factory.mktemp("pack")
    out = base / "out"
    page = out / "docs" / "benchmarks.md"
    done = run_module(
        "bench.pack", "--quick", "--out", str(out), "--cache", str(base), "--docs", str(page), timeout=240
    )
    return json.loads((out / "report.json").read_text()), done.stdout, out


def test_docs_section_holds_the_settings_rules_and_tables(quick: tuple[dict[str, Any], str, Path]) -> None:
    report, _, out = quick
    section = read_section((out / "docs" / "benchmarks.md").read_text(), "bench-pack")
    assert section is not None and section.startswith("## bench-pack: pack throughput\n")
    assert "`python -m bench.pack --quick --out " in section and "**A `--quick` smoke run" in section
    assert (
        "| --small | 3000 |" in section and "| --workers | 2 |" in section and "| profile small | " in section
    )
    assert "| --images | 200 |" in section and "| profile images | " in section
    assert "| --profile | small,large,images,parquet |" in section and "- **images**: " in section
    assert f"| profile | contender | samples/s | MB/s | x {BARE_POOL} | paired |" in section
    assert f"tar {report['versions']['tar']}" in section
    assert "- **paired**: " in section and "- **spread**: " in section
    for row in report["results"]:
        assert f"| {row['profile']} | {row['contender']} | " in section
    for target in report["targets"]:
        assert f"| {target['profile']} | {target['target']} | " in section
    assert section.rstrip().endswith("(img/bench-pack.png)")  # and its plot


def test_quick_run_times_every_contender_and_judges_every_target(
    quick: tuple[dict[str, Any], str, Path],
) -> None:
    report, stdout, out = quick
    for profile in ("small", "large"):
        assert {r["contender"] for r in report["results"] if r["profile"] == profile} == CONTENDERS
        assert {r["baseline"] for r in report["results"] if r["profile"] == profile} == {TAR}
    assert {r["contender"] for r in report["results"] if r["profile"] == "images"} == IMAGE_CONTENDERS
    assert {r["baseline"] for r in report["results"] if r["profile"] == "images"} == {BARE_POOL}
    names = {(t["profile"], t["target"]) for t in report["targets"]}
    assert len(names) == len(report["targets"]) == 2 * (len(FORMATS) + 2) + len(IMAGE_TARGETS) + 1
    assert ("small", "shardpipe tar >= 6x webdataset ShardWriter (script)") in names
    assert ("large", "shardpipe tar >= 1.5x webdataset ShardWriter (script)") in names
    for profile in ("small", "large"):  # the pack without a map, in its default order, against tar cf
        assert {(profile, "shardpipe tar >= 0.5x tar cf"), (profile, MAP_TARGET)} <= names
    assert {("images", name) for name in IMAGE_TARGETS} <= names
    assert all(t["met"] == _judged(t) for t in report["targets"])
    assert {t["rule"] for t in report["targets"] if t["target"] == MAP_TARGET} == {"<="}
    text = (out / "report.md").read_text()
    assert text.startswith("# shardpipe pack benchmark") and "ceiling" not in text
    for target in report["targets"]:
        assert f"| {target['profile']} | {target['target']} | " in text
    assert all(name in stdout for name in CONTENDERS | IMAGE_CONTENDERS)
    images = report["parameters"]["profiles"]["images"]
    assert images["num_samples"] == 200 and images["max_side"] == 256 and images["quality"] == 90
    assert report["costs"]["cli_startup_s"] > 0 and report["parameters"]["repeats"] == 1


def test_quick_run_packs_the_parquet_rows_both_ways_and_judges_their_target(
    quick: tuple[dict[str, Any], str, Path],
) -> None:
    report, _, out = quick
    rows = [r for r in report["results"] if r["profile"] == "parquet"]
    assert {r["contender"] for r in rows} == {FLAT_PARQUET, HF_PARQUET}
    assert {r["baseline"] for r in rows} == {FLAT_PARQUET} and {r["samples"] for r in rows} == {2_000}
    assert [t["target"] for t in report["targets"] if t["profile"] == "parquet"] == [PARQUET_TARGET]
    text = (out / "report.md").read_text()
    assert f"| parquet | {PARQUET_TARGET} | " in text
    assert "- parquet: 2,000 rows of 1,024 bytes of binary plus an int label, row groups of 100" in text


def test_parquet_sources_hold_the_same_rows_one_with_keys_one_in_the_hub_layout(tmp_path: Path) -> None:
    tree = build_parquet(ParquetProfile("parquet", 20, group_rows=5), tmp_path)
    hf, flat = pq.read_table(tree / HF_FOLDER / HF_FILE), pq.read_table(tree / FLAT_LIST)
    assert hf.column_names == ["bin", "label"] and b"huggingface" in (hf.schema.metadata or {})
    assert flat.column("key").to_pylist()[:2] == ["s00000000", "s00000001"]
    assert flat.drop_columns(["key"]).equals(hf.replace_schema_metadata(None))
    assert pq.ParquetFile(tree / FLAT_LIST).metadata.num_row_groups == 4


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The timed rounds on a fake clock, without os.sync()."""
    fake = FakeClock()
    monkeypatch.setattr(pack_run.time, "perf_counter", fake.perf_counter)
    monkeypatch.setattr(pack_run.os, "sync", lambda: None)
    return fake


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


def test_rounds_paired_ratios_and_targets_on_a_fake_clock(tmp_path: Path, clock: FakeClock) -> None:
    profile = Profile("small", 10, 100)
    seconds = {
        TAR: [1.0, 2.0, 1.0],  # the machine slows down in round 2: paired ratios cancel it
        "shardpipe tar": [2.0, 4.0, 2.0],
        "shardpipe lmdb": [2.5, 5.0, 1.5],
        MAP_NOOP: [2.4, 4.4, 2.2],  # per round 1.2, 1.1, 1.1 the time of the pack without a map
        SHARDWRITER_SCRIPT: [13.0, 20.0, 11.0],
    }
    entries = [_fake(name, clock, times, profile) for name, times in seconds.items()]
    workload = byte_workload(profile, tmp_path)
    rows = time_profile(workload, tmp_path / "work", entries, repeats=3, log=False)
    by_name = {r["contender"]: r for r in rows}
    assert by_name["shardpipe lmdb"]["seconds"] == [2.5, 5.0, 1.5]  # rotation kept each one's own times
    assert by_name["shardpipe tar"]["paired_ratio_to_baseline"] == pytest.approx(0.5)
    assert by_name["shardpipe tar"]["median_s"] == 2.0 and by_name["shardpipe tar"]["baseline"] == TAR
    found = {t["target"]: (t["value"], t["met"]) for t in targets(rows)}
    assert found == {
        "shardpipe tar >= 0.5x tar cf": (pytest.approx(0.5), True),
        "shardpipe lmdb >= 0.5x tar cf": (pytest.approx(0.4), False),  # median of 0.4, 0.4, 0.667
        "shardpipe tar >= 6x webdataset ShardWriter (script)": (pytest.approx(5.5), False),
        MAP_TARGET: (pytest.approx(1.1), True),  # a time ratio, judged at most
    }
    large = [{**r, "profile": "large"} for r in rows]
    assert {t["target"]: t["met"] for t in targets(large)}[
        "shardpipe tar >= 1.5x webdataset ShardWriter (script)"
    ]
    slower = [
        {**r, "seconds": [t * 1.2 for t in r["seconds"]]} if r["contender"] == MAP_NOOP else r for r in rows
    ]
    assert {t["target"]: t["met"] for t in targets(slower)}[MAP_TARGET] is False  # 1.32x: too slow


def test_image_targets_divide_by_the_bare_pool_on_a_fake_clock(tmp_path: Path, clock: FakeClock) -> None:
    profile = Profile("images", 10, 100)
    seconds = {
        BARE_POOL: [1.0, 2.0, 1.0],
        PREPARED: [1.2, 2.0, 1.0],  # paired 0.83, 1.0, 1.0 of the bare pool
        SHARDWRITER_LOOP: [2.0, 3.0, 1.5],  # shardpipe's paired ratio to it: 1.67, 1.5, 1.5
    }
    checked: list[str] = []
    entries = [_fake(name, clock, times, profile) for name, times in seconds.items()]
    workload = Workload("images", tmp_path, 10, 1000, BARE_POOL, lambda c, out: checked.append(c.name))
    rows = time_profile(workload, tmp_path / "work", entries, repeats=3, log=False)
    assert sorted(checked) == sorted(3 * list(seconds))  # every run's output checked
    assert {r["baseline"] for r in rows} == {BARE_POOL}
    found = {t["target"]: (t["value"], t["met"]) for t in targets(rows)}
    assert found == {
        f"{PREPARED} >= 0.9x {BARE_POOL}": (pytest.approx(1.0), True),
        f"{PREPARED} >= 1.8x {SHARDWRITER_LOOP}": (pytest.approx(1.5), False),
    }


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


def _photo_tree(root: Path) -> tuple[PhotoProfile, dict[str, bytes]]:
    """Ten small photos as a tree, and what the preparation makes of each, by relative path."""
    from shardpipe.packing.images import ImagePreparation
    from testkit.photos import photo_bytes

    profile = PhotoProfile("images", 10, size=(64, 48), max_side=32)
    prepared = {}
    for index, data in enumerate(photo_bytes(10, size=profile.size, num_workers=0)):
        rel = f"class_{index % 5:02d}/{index:06d}.jpg"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        prepared[rel] = ImagePreparation(profile.max_side, profile.quality).prepare(data)
    return profile, prepared


def _write_tar(path: Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def test_check_prepared_refuses_missing_unprepared_or_damaged_images(tmp_path: Path) -> None:
    tree, out = tmp_path / "tree", tmp_path / "out"
    profile, prepared = _photo_tree(tree)
    for rel, data in prepared.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    check_prepared("files", out, tree, profile)
    first = next(iter(prepared))
    (out / first).write_bytes((tree / first).read_bytes())  # as it came: not shrunk
    with pytest.raises(RuntimeError, match="longest side 64, expected 32"):
        check_prepared("files", out, tree, profile)
    (out / first).write_bytes(prepared[first][: len(prepared[first]) // 2])  # truncated
    with pytest.raises(OSError):
        check_prepared("files", out, tree, profile)
    (out / first).unlink()
    with pytest.raises(RuntimeError, match="expected 10 images, found 9"):
        check_prepared("files", out, tree, profile)

    _write_tar(tmp_path / "tars" / "shard-000000.tar", prepared)
    check_prepared("tars", tmp_path / "tars", tree, profile)
    shards = tmp_path / "shards"
    _write_tar(shards / "ds" / "train" / "shard-000000.tar", prepared)
    manifest = {"splits": {"train": {"shards": [{"samples": 9}]}}}
    (shards / "ds" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RuntimeError, match="the manifest counts 9 samples, expected 10"):
        check_prepared("shards", shards, tree, profile)
    assert Image.open(io.BytesIO(prepared[first])).size == (32, 24)


def test_profile_option_runs_only_the_images_profile(tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = ["--profile", "images", "--images", "20", "--repeats", "1", "--out", str(out)]
    run_module("bench.pack", *command, "--cache", str(tmp_path), timeout=120)
    report = json.loads((out / "report.json").read_text())
    assert {r["profile"] for r in report["results"]} == {"images"}
    assert {r["contender"] for r in report["results"]} == IMAGE_CONTENDERS
    assert {t["target"] for t in report["targets"]} == IMAGE_TARGETS
    with pytest.raises(SystemExit) as exit_info:
        pack_main.main(["--profile", "small,photos"])
    assert exit_info.value.code == 2
