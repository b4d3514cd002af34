"""End to end: the demo's digits, packed to tar, trained by torchrun on 2 gloo ranks for a few epochs.

Why: this is the path a user takes (small files -> ``shardpipe pack`` -> ``ShardedDataset`` under DDP), so it
checks together what the unit tests check apart: equal steps on every rank, pads masked out of the metrics,
and that the data reaching the model is right (a wrong label or image order would not learn to > 90%).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from bench.demo.data import NUM_DIGITS, write_digits
from bench.demo.run import pack, train_command, train_env
from shardpipe.manifest import load_manifest

pytestmark = pytest.mark.bench

pytest.importorskip("sklearn")
pytest.importorskip("PIL")

EPOCHS = 4
WORLD = 2


@pytest.mark.timeout(180)
def test_demo_trains_digits_on_two_ranks(tmp_path: Path) -> None:
    digits = tmp_path / "digits"
    assert write_digits(digits)
    assert sum(1 for _ in digits.rglob("*.png")) == NUM_DIGITS
    assert not write_digits(digits), "a complete tree must be kept, not rewritten"
    packed = tmp_path / "packed-tar"
    pack(digits, packed, "tar")

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        train_command(packed, EPOCHS, WORLD),
        cwd=repo,
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output

    steps = {
        int(r): (int(n), int(p))
        for r, n, p in re.findall(r"rank (\d+) train_steps (\d+) planned (\d+)", done.stdout)
    }
    assert sorted(steps) == list(range(WORLD)), output
    counts = {n for n, _ in steps.values()}
    assert len(counts) == 1, f"ranks ran different numbers of steps: {steps}"
    assert all(n == p > 0 for n, p in steps.values()), f"steps differ from the planned len(loader): {steps}"

    epochs = re.findall(r"^epoch \d+ \(\d+/\d+\) .*val_acc (\S+) .*val_samples (\d+)", done.stdout, re.M)
    assert len(epochs) == EPOCHS, output
    # Pads are masked: the metrics count every val sample exactly once, whatever the padding per rank.
    val_total = sum(s.num_samples for s in load_manifest(packed).split_shards("val"))
    assert [int(n) for _, n in epochs] == [val_total] * EPOCHS, output

    final = re.search(r"^FINAL val_accuracy=(\S+) .*equal_steps=True .*PASS$", done.stdout, re.M)
    assert final is not None, output
    assert float(final.group(1)) > 0.9
