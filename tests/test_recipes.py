"""The training recipes of docs/loaders.md, run for real: 2 CPU ranks (gloo) under each trainer, stopped
after a mid-epoch checkpoint, resumed, 3 epochs in all. Each must train on exactly the batches of an
uninterrupted run (computed here by the loader itself): every sample once per epoch, pads flagged, the
same step count on every rank. The scripts live in ``tests/recipes/``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loaders import ShardedDataset, make_loader
from tests.datagen import pack_dataset
from tests.recipes.common import BATCH_SIZE, NUM_WORKERS, SEED

pytestmark = pytest.mark.dist

ROOT = Path(__file__).resolve().parents[1]
NUM_SAMPLES = 45  # uneven shards of 7; 23 samples a rank (one flagged pad), 6 steps an epoch
EPOCHS = 3
STOP_AT = 8  # a checkpoint in the middle of the second epoch


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack_dataset(tmp_path_factory.mktemp("recipes"), "tar", NUM_SAMPLES, max_samples=7)


def uninterrupted(path: Path) -> list[list[dict[str, Any]]]:
    """Each rank's batches over the epochs, as make_loader yields them."""
    ranks = []
    for rank in range(2):
        loader = make_loader(
            ShardedDataset(path, seed=SEED, rank=rank, world_size=2), BATCH_SIZE, NUM_WORKERS
        )
        batches = []
        for epoch in range(EPOCHS):
            loader.set_epoch(epoch)
            batches += [{"epoch": epoch, "keys": b["__key__"], "pads": b["__pad__"].tolist()} for b in loader]
        ranks.append(batches)
    return ranks


def run(command: list[str], timeout: float = 240) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-6000:]}"


def torchrun(script: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", script]


LAUNCHERS = {  # Lightning and Fabric start their second rank themselves
    "torchrun_train": torchrun,
    "stateful_train": torchrun,
    "accelerate_train": torchrun,
    "lightning_train": lambda script: [sys.executable, script],
    "fabric_train": lambda script: [sys.executable, script],
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("recipe", "option"),
    [
        ("torchrun_train", None),
        ("stateful_train", None),
        ("accelerate_train", None),
        ("fabric_train", None),
        ("lightning_train", "use_distributed_sampler=True"),
        ("lightning_train", "use_distributed_sampler=False"),
    ],
)
def test_a_stopped_and_resumed_run_trains_on_the_uninterrupted_runs_batches(
    dataset: Path, tmp_path: Path, recipe: str, option: str | None
) -> None:
    command = [*LAUNCHERS[recipe](f"tests/recipes/{recipe}.py"), str(dataset), str(tmp_path)]
    command += ["--epochs", str(EPOCHS)] + (["--option", option] if option else [])
    run([*command, "--stop-at", str(STOP_AT)])
    for rank in range(2):
        assert len((tmp_path / f"rank{rank}.jsonl").read_text().splitlines()) == STOP_AT
    run([*command, "--resume"])
    expected = uninterrupted(dataset)
    for rank in range(2):
        got = [json.loads(line) for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()]
        assert got == expected[rank], f"rank {rank}"
    for epoch in range(EPOCHS):  # what the oracle promises: each sample once an epoch, the pad flagged
        keys = [k for batches in expected for b in batches if b["epoch"] == epoch for k, pad in
                zip(b["keys"], b["pads"], strict=True) if not pad]  # fmt: skip
        assert sorted(keys) == sorted(set(keys)) and len(keys) == NUM_SAMPLES
