"""``python -m bench.io --profile images --quick`` and ``--data``: structure, and every target judged; never
speed (a quick run's figures say nothing about it)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.common.docs_page import read_section
from bench.io.image_contenders import (
    DATA_NAMES,
    FUSED_DEVICE,
    IMAGE_NAMES,
    LIMIT,
    array_crop,
    crop_box,
    is_limit,
    train_crop,
)
from bench.io.targets import IMAGE_TARGETS
from tests.bench.scripts import ROOT, run_module

pytestmark = pytest.mark.bench


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return run_module("bench.io", *args, timeout=timeout)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, Path, str]:
    """The quick image run (64 and 16 photos), its report, output folder, docs page and terminal text."""
    base = tmp_path_factory.mktemp("images")
    out, page = base / "out", base / "docs" / "benchmarks.md"
    done = _run("--profile", "images", "--quick", "--out", str(out), "--docs", str(page))
    return json.loads((out / "report.json").read_text()), out, page, done.stdout


def test_every_image_contender_in_both_profiles(images: tuple[dict, Path, Path, str]) -> None:
    report = images[0]
    assert set(report["datasets"]) == {"images", "images-large"}
    assert report["datasets"]["images"]["num_samples"] == 64
    for profile in ("images", "images-large"):
        names = [e["contender"] for e in report["results"] if e["profile"] == profile]
        assert names == list(IMAGE_NAMES)


def test_image_numbers_are_consistent(images: tuple[dict, Path, Path, str]) -> None:
    report = images[0]
    threshold, batch_size = report["parameters"]["threshold"], report["parameters"]["batch_size"]
    for e in report["results"]:
        dataset = report["datasets"][e["profile"]]
        assert e["samples_per_s_min"] <= e["samples_per_s"] <= e["samples_per_s_max"]
        # A quick loader window can be served from batches its workers decoded before it began (the
        # fused crops are fast enough that it happens): its CPU time may round to 0, a limit's never.
        cpu = e["cpu_ms_per_sample"]
        assert (cpu > 0 if is_limit(e["contender"]) else cpu >= 0) and e["peak_rss_mb"] > 0
        assert e["paired"][LIMIT] > 0 and e["paired"]["imagefolder-pil"] > 0
        if e["contender"] == "imagefolder-pil":
            assert e["paired"]["imagefolder-pil"] == pytest.approx(1.0)
        if is_limit(e["contender"]):
            assert e["verdict"] == "-"
            assert e["runs"][0]["samples"] >= dataset["measured_steps"] * batch_size
            continue
        assert 0.0 <= e["wait_fraction"] <= 1.0
        assert e["verdict"] == ("input-bound" if e["wait_fraction"] > threshold else "compute-bound")
        for run in e["runs"]:
            assert run["steps"] == dataset["measured_steps"]
            assert 0 < run["samples"] <= run["steps"] * batch_size
            assert 0.0 <= run["wait_s"] <= run["seconds"] and run["cpu_s"] >= 0


def test_every_image_target_is_judged(images: tuple[dict, Path, Path, str]) -> None:
    report, _, _, stdout = images
    found = {(t["profile"], t["target"]): t for t in report["targets"]}
    assert len(found) == len(IMAGE_TARGETS)
    for profile, contender, baseline, threshold in IMAGE_TARGETS:
        target = found[(profile, f"{contender} >= {threshold:g}x {baseline}")]
        assert math.isfinite(target["value"]) and target["value"] > 0
        assert target["met"] == (target["value"] >= threshold) and target["rounds"] == 1
        entries = {e["contender"]: e for e in report["results"] if e["profile"] == profile}
        assert target["value"] == pytest.approx(entries[contender]["paired"][baseline])
    assert "targets (paired ratios):" in stdout


def test_image_docs_section_is_its_own(images: tuple[dict, Path, Path, str]) -> None:
    report, out, page, _ = images
    text = page.read_text()
    assert read_section(text, "bench-io") is None  # the default run's section is not replaced
    section = read_section(text, "bench-io-images")
    assert section is not None and "**A `--quick` smoke run" in section
    for profile in ("images", "images-large"):
        assert f"#### {profile} profile" in section
        assert f"| data: {profile} profile | " in section
    for name in IMAGE_NAMES:
        assert section.count(f"| {name} | ") == 2
    assert "#### Targets" in section and "- **decode-limit**: " in section
    assert section.rstrip().endswith("(img/bench-io-images.png)")
    assert (page.parent / "img" / "bench-io-images.png").read_bytes() == (out / "images.png").read_bytes()
    assert (out / "report.md").read_text().startswith("# shardpipe image input benchmark")
    assert report["hardware"]["cpu"] and "pillow" in report["versions"]


def test_own_data_prints_its_verdict_and_stays_out_of_the_docs(tmp_path: Path) -> None:
    """``--data`` on a pack without labels: the per-sample path, the fused one, both decode limits."""
    from shardpipe import PackOptions, pack
    from testkit.photos import make_photos

    make_photos(tmp_path / "photos", 24, num_workers=0)
    pack(
        tmp_path / "photos",
        tmp_path / "pack",
        PackOptions(format="tar", max_samples=8, workers=1),
        quiet=True,
    )
    out, page = tmp_path / "out", tmp_path / "docs" / "benchmarks.md"
    done = _run("--data", str(tmp_path / "pack"), "--field", "jpg", "--quick", "--out", str(out),
                "--docs", str(page))  # fmt: skip
    assert not page.exists()
    report = json.loads((out / "report.json").read_text())
    assert [e["contender"] for e in report["results"]] == list(DATA_NAMES)
    assert report["datasets"]["data"]["num_samples"] == 24
    for start in ("your data: ", "per-sample Pillow", "fused crops", "the fused path gives",
                  "decode limit (2 processes", "prepared at pack time"):  # fmt: skip
        assert any(line.startswith(start) for line in report["verdicts"]), start
        assert start in done.stdout
    fused = next(e for e in report["results"] if e["contender"] == "shardpipe-fused")
    assert set(fused["paired"]) == {"shardpipe-pil", LIMIT}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "/nonexistent/pack"], "no shardpipe dataset there"),
        (["--profile", "images", "--remote"], "--remote measures the byte profiles"),
        (["--profile", "images", "--contenders", "shardpipe-tar"], "unknown contender(s) shardpipe-tar"),
    ],
)
def test_image_usage_errors_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.io.__main__ import parse_args

    with pytest.raises(SystemExit) as exit_info:
        parse_args(args)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_data_field_must_be_in_the_pack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.io.__main__ import parse_args
    from shardpipe import PackOptions, pack

    (tmp_path / "tree" / "a").mkdir(parents=True)
    (tmp_path / "tree" / "a" / "0.bin").write_bytes(b"x")
    pack(tmp_path / "tree", tmp_path / "pack", PackOptions(format="tar", workers=1), quiet=True)
    with pytest.raises(SystemExit):
        parse_args(["--data", str(tmp_path / "pack"), "--field", "jpg"])
    assert "--field jpg: the pack's fields are bin" in capsys.readouterr().err
    assert parse_args(["--data", str(tmp_path / "pack"), "--field", "bin"]).contenders == list(DATA_NAMES)


def test_the_pillow_crop_follows_torchvisions_algorithm() -> None:
    """Boxes inside the image, of an allowed area and aspect ratio (or the centre fallback); (3, 224, 224)
    uint8 out, from an image and from a decoded array alike."""
    from PIL import Image

    torch.manual_seed(0)
    for width, height in [(500, 375), (375, 500), (2000, 1500), (300, 40)]:
        for _ in range(200):
            top, left, h, w = crop_box(width, height)
            assert top >= 0 and top + h <= height and left >= 0 and left + w <= width
            drawn = 0.08 * 0.95 * width * height <= w * h and 3 / 4 * 0.95 <= w / h <= 4 / 3 * 1.05
            if not drawn:  # ten draws missed: the centre crop of the nearest allowed ratio
                assert (top, left) == ((height - h) // 2, (width - w) // 2)
    array = np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8)
    for crop in (train_crop(Image.fromarray(array)), array_crop(array)):
        assert crop.shape == (3, 224, 224) and crop.dtype == torch.uint8


def test_device_cpu_runs_the_device_crops_and_reports_their_trainer_time(tmp_path: Path) -> None:
    """``--device cpu``: the same code as on a GPU, through nvImageCodec's CPU backend, end to end."""
    out = tmp_path / "out"
    names = f"shardpipe-fused,{FUSED_DEVICE}"
    _run("--profile", "images", "--quick", "--device", "cpu", "--contenders", names, "--out", str(out))
    report = json.loads((out / "report.json").read_text())
    for profile in ("images", "images-large"):
        entries = {e["contender"]: e for e in report["results"] if e["profile"] == profile}
        assert list(entries) == ["shardpipe-fused", FUSED_DEVICE]
        assert (
            entries[FUSED_DEVICE]["samples_per_s"] > 0
            and entries[FUSED_DEVICE]["trainer_decode_ms_per_batch"] > 0
        )
        assert "trainer_decode_ms_per_batch" not in entries["shardpipe-fused"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_device_cuda_is_refused_without_cuda(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "bench.io",
        "--profile",
        "images",
        "--device",
        "cuda",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--device cuda: no CUDA device here" in done.stderr
