"""A mixture on real gloo ranks with DataLoader workers: equal planned and actual steps on every rank, each
source's exact count over the ranks, per-source metrics exact across ranks (pads excluded), the monitor's
per-source line, and a state saved on 2 ranks resumed on 3 (every remaining sample once)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from testkit.distributed import run_ranks
from tests.datagen import pack_dataset

pytestmark = pytest.mark.dist

BATCH = 4
TOTAL = 41  # not a multiple of the world: pads on some ranks


def loader_for(paths: dict[str, str], workers: int) -> Any:
    from loaders import Mixture, ShardedDataset, make_loader

    sources = {name: ShardedDataset(path) for name, path in paths.items()}
    mix = Mixture(sources, {"a": 0.7, "b": 0.3}, samples_per_epoch=TOTAL, seed=2)
    return make_loader(mix, batch_size=BATCH, num_workers=workers, persistent_workers=False)


def real(batch: dict[str, Any]) -> list[list[Any]]:
    pads = batch["__pad__"].tolist()
    return [
        [s, k] for s, k, p in zip(batch["__source__"].tolist(), batch["__key__"], pads, strict=True) if not p
    ]


def epoch_on_ranks(rank: int, world_size: int, paths: dict[str, str]) -> dict[str, Any]:
    import torch

    from loaders import DistributedMetrics, InputMonitor, validate_dataloader_sync

    loader = loader_for(paths, workers=2)
    loader.set_epoch(1)
    planned = validate_dataloader_sync(loader, timeout=30)
    metrics = DistributedMetrics(num_classes=2, num_sources=2)
    monitor = InputMonitor(loader)
    seen, steps = [], 0
    for batch in monitor:
        source = batch["__source__"]
        metrics.update(torch.zeros_like(source), source, pad_mask=batch["__pad__"], source=source)
        seen += real(batch)
        steps += 1
    out = {"planned": planned, "steps": steps, "seen": seen, "metrics": metrics.compute()}
    out["line"] = monitor.summary_line()
    return out


def save_on_ranks(rank: int, world_size: int, paths: dict[str, str]) -> dict[str, Any]:
    loader = loader_for(paths, workers=2)
    loader.set_epoch(0)
    batches = iter(loader)
    consumed = [x for _ in range(3) for x in real(next(batches))]
    return {"consumed": consumed, "state": loader.state_dict()}


def resume_on_ranks(
    rank: int, world_size: int, paths: dict[str, str], state: dict[str, Any]
) -> dict[str, Any]:
    from loaders import validate_dataloader_sync

    loader = loader_for(paths, workers=1)
    loader.load_state_dict(state)
    loader.set_epoch(0)
    planned = validate_dataloader_sync(loader, timeout=30)
    batches = list(loader)
    return {"planned": planned, "steps": len(batches), "rest": [x for b in batches for x in real(b)]}


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {
        "a": str(pack_dataset(tmp_path_factory.mktemp("dist-a"), "tar", 19, max_samples=5)),
        "b": str(pack_dataset(tmp_path_factory.mktemp("dist-b"), "tfrecord", 9, max_samples=4)),
    }


def test_equal_steps_exact_counts_and_per_source_metrics(paths: dict[str, str]) -> None:
    results = run_ranks(epoch_on_ranks, 2, paths, timeout=120)
    assert len({(r["planned"], r["steps"]) for r in results}) == 1
    counts = Counter(s for r in results for s, _ in r["seen"])
    assert counts == {0: 29, 1: 12}  # largest remainder of 0.7 x 41 and 0.3 x 41
    per_source = results[0]["metrics"]["per_source"]
    assert all(r["metrics"] == results[0]["metrics"] for r in results)  # the same numbers on every rank
    assert [p["samples"] for p in per_source] == [29, 12]
    assert [p["accuracy"] for p in per_source] == [1.0, 0.0]  # predicting source 0 everywhere
    assert "per source a 29 (pass 3 at 1), b 12 (pass 2 at 6)" in results[0]["line"]  # after 2 epochs


def test_saved_on_two_ranks_resumes_on_three(paths: dict[str, str]) -> None:
    saved = run_ranks(save_on_ranks, 2, paths, timeout=120)
    state = saved[0]["state"]
    assert saved[1]["state"] == state
    resumed = run_ranks(resume_on_ranks, 3, paths, state, timeout=120)
    assert len({(r["planned"], r["steps"]) for r in resumed}) == 1
    before = [tuple(x) for r in saved for x in r["consumed"]]
    after = [tuple(x) for r in resumed for x in r["rest"]]
    fresh = loader_for(paths, workers=0)  # this process: one rank
    fresh.set_epoch(0)
    whole = Counter(tuple(x) for batch in fresh for x in real(batch))
    assert Counter(before + after) == whole  # every remaining sample once (a source's pass may wrap)
    assert Counter(s for s, _ in whole.elements()) == {0: 29, 1: 12}
