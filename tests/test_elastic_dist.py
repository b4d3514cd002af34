"""Elastic resume for real: a state saved on W1 gloo ranks loads on W2 ranks (2 -> 3, 3 -> 2, 4 -> 1, and
workers 2 -> 0), finishes the interrupted epoch and then runs the epochs of a fresh W2 run.

Checked over the interrupted epoch: the samples consumed before the save plus those yielded after it cover
every sample exactly once (plus flagged pads); every new rank runs the same number of batches, which
``len(loader)`` counts with those consumed before the save; the next epoch on each new rank equals a fresh
run's.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from loaders import ShardedDataset, make_loader
from testkit.distributed import run_ranks
from tests.datagen import pack_dataset

pytestmark = pytest.mark.dist

NUM_SAMPLES = 47
BATCH = 4
SEED = 5
EPOCH = 2


def loader_for(path: str, workers: int, rank: int | None = None, world_size: int | None = None) -> Any:
    dataset = ShardedDataset(path, seed=SEED, rank=rank, world_size=world_size)
    return make_loader(dataset, batch_size=BATCH, num_workers=workers, persistent_workers=False)


def real_keys(batch: dict[str, Any]) -> list[str]:
    return [k for k, pad in zip(batch["__key__"], batch["__pad__"].tolist(), strict=True) if not pad]


def phase(rank: int, world_size: int, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """Run each task on this rank: save after some batches, or resume a state to the end of the epoch."""
    from loaders import validate_dataloader_sync

    out: dict[str, Any] = {}
    for task in tasks:
        loader = loader_for(task["path"], task["workers"])
        if task["action"] == "save":
            loader.set_epoch(EPOCH)
            batches = iter(loader)
            consumed = [k for _ in range(task["batches"]) for k in real_keys(next(batches))]
            out[task["name"]] = {"consumed": consumed, "state": loader.state_dict()}
            del batches
            continue
        loader.load_state_dict(task["state"])
        loader.set_epoch(EPOCH)  # the usual loop sets the epoch again: the resume point survives it
        planned = validate_dataloader_sync(loader, timeout=30)  # equal on every new rank, or it raises
        rest = [real_keys(b) for b in loader]
        loader.set_epoch(EPOCH + 1)
        following = [k for b in loader for k in b["__key__"]]
        out[task["name"]] = {"planned": planned, "rest": rest, "following": following}
    return out


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(pack_dataset(tmp_path_factory.mktemp("elastic"), "tar", NUM_SAMPLES, max_samples=7))


def save(name: str, path: str, workers: int, batches: int) -> dict[str, Any]:
    return {"name": name, "path": path, "action": "save", "workers": workers, "batches": batches}


def resume(name: str, path: str, workers: int, state: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "path": path, "action": "resume", "workers": workers, "state": state}


def saved(results: list[dict[str, Any]], name: str) -> tuple[list[str], dict[str, Any]]:
    states = [r[name]["state"] for r in results]
    assert all(s == states[0] for s in states)  # the state is identical on every rank
    return [k for r in results for k in r[name]["consumed"]], states[0]


def check(
    path: str, consumed: list[str], resumed: list[dict[str, Any]], workers: int, state: dict[str, Any]
) -> None:
    new_world = len(resumed)
    counts = [len(r["rest"]) for r in resumed]
    before = sum(segment["batches"] for segment in state["segments"])  # what len() adds, as trainers do
    assert len(set(counts)) == 1 and before + counts[0] == resumed[0]["planned"]
    seen = Counter(consumed + [k for r in resumed for batch in r["rest"] for k in batch])
    assert len(seen) == NUM_SAMPLES and set(seen.values()) == {1}
    for rank, result in enumerate(resumed):  # the next epoch is a fresh new-world run's
        fresh = loader_for(path, workers, rank, new_world)
        fresh.set_epoch(EPOCH + 1)
        assert result["following"] == [k for b in fresh for k in b["__key__"]]


@pytest.mark.timeout(300)
def test_resume_on_another_world_size(path: str) -> None:
    first = run_ranks(phase, 2, [save("2to3", path, 2, 3), save("workers", path, 2, 2)], timeout=120)
    consumed_a, state_a = saved(first, "2to3")
    consumed_d, state_d = saved(first, "workers")

    second = run_ranks(phase, 3, [resume("2to3", path, 2, state_a), save("3to2", path, 1, 2)], timeout=120)
    check(path, consumed_a, [r["2to3"] for r in second], workers=2, state=state_a)
    consumed_b, state_b = saved(second, "3to2")

    third = run_ranks(phase, 2, [resume("3to2", path, 0, state_b), resume("workers", path, 0, state_d)],
                      timeout=120)  # fmt: skip
    check(path, consumed_b, [r["3to2"] for r in third], workers=0, state=state_b)
    check(path, consumed_d, [r["workers"] for r in third], workers=0, state=state_d)

    fourth = run_ranks(phase, 4, [save("4to1", path, 2, 1)], timeout=120)
    consumed_c, state_c = saved(fourth, "4to1")
    alone = phase(0, 1, [{**resume("4to1", path, 0, state_c)}])  # one process: no group needed
    check(path, consumed_c, [alone["4to1"]], workers=0, state=state_c)


def test_a_fresh_state_resumes_nothing_twice(path: str, tmp_path: Path) -> None:
    """Saved before any batch, on 3 ranks: loading it on 1 rank reads the whole epoch once."""
    states = [loader_for(path, 0, r, 3) for r in range(3)]
    for loader in states:
        loader.set_epoch(EPOCH)
    state = states[0].state_dict()
    alone = phase(0, 1, [resume("fresh", path, 0, state)])
    check(path, [], [alone["fresh"]], workers=0, state=state)
