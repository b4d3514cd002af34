"""``python -m bench.shuffle`` on a tiny dataset (report structure), and its metrics on hand-made orders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.common.docs_page import read_section
from bench.shuffle import metrics

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]
C, PER_CLASS, B = 20, 300, 32  # 6,000 samples: enough full batches for tight expectations
N = C * PER_CLASS


def sorted_labels() -> np.ndarray:
    return np.repeat(np.arange(C), PER_CLASS)  # pack position -> label, class by class


def scores(order: np.ndarray) -> tuple[float, float]:
    labels = metrics.full_batches(sorted_labels()[order], [B] * (N // B) + [N % B], B)
    return metrics.classes_per_batch(labels), metrics.entropy_per_batch(labels, C)


def test_ideal_classes_formula() -> None:
    assert metrics.ideal_classes(100, 64) == pytest.approx(47.44, abs=0.01)  # the figure
    assert metrics.ideal_classes(10, 1) == pytest.approx(1.0)
    assert metrics.ideal_entropy(2, 1) == pytest.approx(0.0)
    assert metrics.ideal_entropy(C, B) < np.log2(C)


def test_global_permutation_scores_near_the_ideal() -> None:
    order = np.random.default_rng(1).permutation(N)
    classes, entropy = scores(order)
    assert classes / metrics.ideal_classes(C, B) == pytest.approx(1.0, abs=0.03)
    assert entropy == pytest.approx(metrics.ideal_entropy(C, B), abs=0.05)
    assert abs(metrics.spearman(np.arange(N), order)) < 0.05
    shards = np.arange(N) // 100  # 60 equal shards
    rate = metrics.same_shard_rate(shards[order])
    assert rate / metrics.chance_same_shard([100] * 60) == pytest.approx(1.0, abs=0.35)
    other = np.random.default_rng(2).permutation(N)
    assert abs(metrics.epoch_correlation(order, other, N)) < 0.05
    assert metrics.exactly_once(order, N)


def test_sorted_order_scores_one_class_per_batch() -> None:
    identity = np.arange(N)
    classes, entropy = scores(identity)
    assert classes == pytest.approx(1.0, abs=0.1)  # a batch straddles two classes now and then
    assert entropy < 0.1
    assert metrics.spearman(identity, identity) == pytest.approx(1.0)
    assert metrics.spearman(identity, identity[::-1]) == pytest.approx(-1.0)
    assert metrics.same_shard_rate(identity // 100) == pytest.approx(
        1 - 59 / (N - 1)
    )  # all but the 59 shard changes
    assert metrics.epoch_correlation(identity, identity, N) == pytest.approx(1.0)


def test_exact_counts_on_a_hand_made_batch() -> None:
    labels = np.array([[0, 0, 1, 1], [2, 2, 2, 2]])
    assert metrics.classes_per_batch(labels) == pytest.approx(1.5)
    assert metrics.entropy_per_batch(labels, 3) == pytest.approx(0.5)  # (1 bit + 0 bits) / 2
    cut = metrics.full_batches(np.arange(10), [4, 4, 2], 4)
    assert cut.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="sum to 9"):
        metrics.full_batches(np.arange(10), [4, 4, 1], 4)
    assert not metrics.exactly_once(np.array([0, 0, 2]), 3)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("shuffle")
    command = [
        sys.executable, "-m", "bench.shuffle", "--classes", "8", "--per-class", "40", "--shard-samples", "20",
        "--batch-size", "16", "--buffers", "32,128", "--blocks", "1,8", "--repeats", "2",
        "--speed-samples", "640", "--out", str(tmp / "out"), "--cache", str(tmp / "cache"),
        "--docs", str(tmp / "docs" / "benchmarks.md"),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert (tmp / "out" / "report.md").read_text().startswith("# shardpipe shuffle benchmark")
    assert (tmp / "out" / "quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "classes per batch >= 0.9x ideal" in done.stdout
    report: dict = json.loads((tmp / "out" / "report.json").read_text())
    report["docs"] = str(tmp / "docs" / "benchmarks.md")  # the page, for the docs test
    return report


def test_docs_section_holds_the_settings_targets_tables_and_plot(report: dict) -> None:
    page = Path(report["docs"])
    section = read_section(page.read_text(), "bench-shuffle")
    assert section is not None and section.startswith("## bench-shuffle: how well batches mix\n")
    assert "`python -m bench.shuffle --classes 8 --per-class 40 " in section
    assert "| --buffers | 32,128 |" in section and "| --blocks | 1,8 |" in section
    assert "| num_shards | 16 |" in section and "- **speed_target**: " in section
    assert "- **spread**: the grid's speeds are single runs" in section
    for target in report["targets"]:
        assert target["target"] in section
    for pack in ("sorted", "hashed"):
        assert f"#### {pack} pack: ideal " in section
    for entry in report["results"]:
        assert f"| {entry['label']}" in section
    assert section.rstrip().endswith("(img/bench-shuffle.png)")
    figure = page.parent / "img" / "bench-shuffle.png"
    assert figure.read_bytes() == (page.parent.parent / "out" / "quality.png").read_bytes()


def test_report_covers_every_configuration(report: dict) -> None:
    for pack in ("sorted", "hashed"):
        labels = [e["label"] for e in report["results"] if e["pack"] == pack]
        assert labels[:2] == ["shardpipe defaults", "shardpipe reference"]
        assert {"shardpipe b=1 w=32", "shardpipe b=8 w=128", "webdataset shuffle(128)"} <= set(labels)
        assert labels[-1] == "global permutation"
    assert sum(e["is_default"] for e in report["results"]) == 2
    assert report["num_shards"] == 16  # 320 samples / 20
    assert {t["threshold"] for t in report["targets"]} == {0.9, 0.97, 1024}
    assert set(report["speed"]) == {"sorted", "hashed"}
    assert all(len(runs) == 2 for pair in report["speed"].values() for runs in pair.values())


def test_report_metrics_are_consistent(report: dict) -> None:
    ideal = metrics.ideal_classes(8, 16)
    for e in report["results"]:
        assert e["exactly_once"], e["label"]
        assert e["ideal_classes"] == pytest.approx(ideal)
        assert e["classes_ratio"] == pytest.approx(e["classes_per_batch"] / ideal)
        assert 1.0 <= e["classes_per_batch"] <= 8.0
        assert e["same_shard_ratio"] == pytest.approx(e["same_shard_rate"] / e["chance_same_shard"])
        assert e["chance_same_shard"] == pytest.approx(1 / 16)
        assert 0.0 <= e["spearman_abs"] <= 1.0 and -1.0 <= e["epoch_correlation"] <= 1.0
        assert e["samples_per_s"] > 0 and e["full_batches"] == 2 * (320 // 16)
        if e["family"] == "shardpipe" and not e["is_default"] and e["label"] != "shardpipe reference":
            assert e["memory_samples"] == e["shuffle_buffer"]
    sorted_pack = {e["label"]: e for e in report["results"] if e["pack"] == "sorted"}
    hashed_pack = {e["label"]: e for e in report["results"] if e["pack"] == "hashed"}
    # the ideal mixes either pack; a small window of a class-sorted pack cannot
    assert sorted_pack["global permutation"]["classes_ratio"] > 0.9
    assert hashed_pack["global permutation"]["classes_ratio"] > 0.9
    assert (
        sorted_pack["shardpipe b=8 w=32"]["classes_ratio"]
        < hashed_pack["shardpipe b=8 w=32"]["classes_ratio"]
    )
