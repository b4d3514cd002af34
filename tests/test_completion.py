"""A pass ends by count: trainers stop at ``len(loader)`` and never pull ``StopIteration``. After the last
planned batch the epoch is complete whatever the consumer does next; ``len`` counts a resumed epoch as
trainers do; the dataset carries the state, for its own loop (torchdata's ``StatefulDataLoader``) or
through make_loader's; a plain ``DataLoader`` gets whole batches per worker or a clear error, and a
warning when ``set_epoch`` is forgotten."""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from loaders import Mixture, ShardedDataset, make_loader
from tests.datagen import pack_dataset

BATCH = 4


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        "a": pack_dataset(tmp_path_factory.mktemp("done-a"), "tar", 61, max_samples=9),
        "b": pack_dataset(tmp_path_factory.mktemp("done-b"), "lmdb", 19, max_samples=5),
    }


def single(paths: dict[str, Path], rank: int = 0, world: int = 2, **options: Any) -> ShardedDataset:
    return ShardedDataset(paths["a"], rank=rank, world_size=world, seed=3, **options)


def mixed(paths: dict[str, Path], rank: int = 0, world: int = 2, **options: Any) -> Mixture:
    sources = {name: ShardedDataset(path, rank=rank, world_size=world) for name, path in paths.items()}
    return Mixture(sources, weights={"a": 0.6, "b": 0.4}, samples_per_epoch=70, seed=3, **options)


def keys(batches: Any) -> list[tuple[str, ...]]:
    return [tuple(b["__key__"]) for b in batches]


@pytest.mark.parametrize("kind", ["single", "mixture"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resumed_epoch_stopped_at_len_is_not_replayed(
    paths: dict[str, Path], kind: str, num_workers: int
) -> None:
    """The issue's reproducer: resume after 3 batches, stop at ``len`` as Lightning does; the next pass is
    the next epoch, as in a run that was never interrupted."""
    make = single if kind == "single" else mixed
    reference = make_loader(make(paths), BATCH, num_workers)
    epochs = [keys(reference) for _ in range(3)]  # the loader advances the epoch itself
    run = make_loader(make(paths), BATCH, num_workers)
    it = iter(run)
    first = keys(next(it) for _ in range(3))
    state = json.loads(json.dumps(run.state_dict()))
    del it
    resumed = make_loader(make(paths), BATCH, num_workers)
    resumed.load_state_dict(state)
    assert len(resumed) == len(epochs[0])  # the epoch as a trainer that restored its own count sees it
    rest = keys(itertools.islice(resumed, len(resumed) - 3))
    assert first + rest == epochs[0]
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["segments"] == []
    assert keys(itertools.islice(resumed, len(resumed))) == epochs[1]  # stopped at len again
    assert keys(resumed) == epochs[2]


def test_len_counts_what_a_resumed_run_consumed_on_another_world(paths: dict[str, Path]) -> None:
    """Resumed on another world, the pass yields the re-planned rest; ``len`` adds the batches consumed
    before the save, so a trainer that restored its step count ends the epoch where the data ends."""
    run = make_loader(single(paths, 0, 2), BATCH, 0)
    it = iter(run)
    for _ in range(3):
        next(it)
    state = run.state_dict()
    for world in (1, 3):
        resumed = make_loader(single(paths, 0, world), BATCH, 2)
        resumed.load_state_dict(state)
        rest = keys(resumed)
        assert len(resumed) == 3 + len(rest)
        resumed.set_epoch(1)
        assert len(resumed) == len(keys(resumed))  # a fresh epoch: exactly what the pass yields


def test_the_dataset_saves_and_loads_what_its_loader_does(paths: dict[str, Path]) -> None:
    """A trainer that wraps the loader without its ``state_dict`` (Fabric) saves the dataset instead."""
    dataset = single(paths)
    loader = make_loader(dataset, BATCH, 2)
    assert dataset.state_dict() == loader.state_dict()  # before any pass: epoch 0, nothing consumed
    it = iter(loader)
    consumed = keys(next(it) for _ in range(5))
    state = dataset.state_dict()
    assert state == loader.state_dict() and state["segments"][-1]["batches"] == 5
    del it
    fresh = single(paths)
    fresh.load_state_dict(state)
    again = make_loader(fresh, BATCH, 2)
    reference = make_loader(single(paths), BATCH, 2)
    assert consumed + keys(again) == keys(reference)


@pytest.mark.parametrize(("kind", "num_workers"), [("single", 0), ("single", 2), ("mixture", 2)])
def test_stateful_dataloader_resumes_from_the_workers_states(
    paths: dict[str, Path], kind: str, num_workers: int
) -> None:
    def loader() -> tuple[ShardedDataset, StatefulDataLoader]:
        dataset = (single if kind == "single" else mixed)(paths, batch_size=BATCH)
        return dataset, StatefulDataLoader(dataset, batch_size=BATCH, num_workers=num_workers)

    _, reference = loader()
    expected = keys(reference)
    dataset, run = loader()
    it = iter(run)
    first = keys(next(it) for _ in range(5))
    state = run.state_dict()
    del it
    dataset, resumed = loader()
    resumed.load_state_dict(state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rest = keys(resumed)
    assert not [str(w.message) for w in caught]  # torchdata warns where it must fast-forward instead
    assert first + rest == expected
    dataset.set_epoch(1)
    assert len(keys(resumed)) == len(expected) == len(resumed)  # the next pass is a whole epoch


def test_a_workers_state_resumes_only_its_own_plan(paths: dict[str, Path]) -> None:
    dataset = single(paths, batch_size=BATCH)
    it = iter(dataset)
    next(it)
    state = dataset.state_dict()
    assert state["worker"] == {"index": 0, "role": 0, "samples": 1}
    other = single(paths, batch_size=BATCH + 1)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="found worker 0 of world_size=2, num_workers=0, batch_size=4"):
        next(iter(other))
    with pytest.raises(ValueError, match="one DataLoader worker's state"):
        make_loader(single(paths), BATCH, 0).load_state_dict(state)


def test_a_plain_dataloader_with_workers_needs_the_batch_size(paths: dict[str, Path]) -> None:
    dataset = single(paths)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=2)
    with pytest.raises(ValueError, match=r"Pass ShardedDataset\(\.\.\., batch_size=B\)"):
        next(iter(loader))
    aligned = single(paths, batch_size=BATCH)
    for num_workers in (0, 1, 2):
        loader = torch.utils.data.DataLoader(aligned, batch_size=BATCH, num_workers=num_workers)
        assert len(keys(loader)) == len(loader) == -(-len(aligned) // BATCH)


def test_a_plain_dataloader_warns_when_set_epoch_is_forgotten(
    paths: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    dataset = single(paths, batch_size=BATCH)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=0)
    with caplog.at_level("WARNING", logger="loaders"):
        for epoch in range(2):
            dataset.set_epoch(epoch)
            list(loader)
        assert "set_epoch() was not called" not in caplog.text
        list(loader)
    assert "set_epoch() was not called between two passes" in caplog.text
