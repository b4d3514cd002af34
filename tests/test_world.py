"""World and worker discovery: explicit arguments, process group, environment, defaults, and validation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from loaders.distributed.world import get_worker, get_world


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun or CI may have set these; every test starts from a single, undistributed process."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def test_default_is_single_process() -> None:
    assert get_world() == (0, 1)


def test_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert get_world() == (3, 4)


def test_explicit_overrides_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert get_world(1, 2) == (1, 2)
    assert get_world(rank=0) == (0, 4)
    assert get_world(world_size=8) == (3, 8)


def test_explicit_without_env() -> None:
    assert get_world(5, 6) == (5, 6)
    assert get_world(rank=0) == (0, 1)


def test_world_without_rank_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaulting to rank 0 would make every process read the same share."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"world_size is 4 but the rank is unknown.*setup\(\).*\[0, 4\)"):
        get_world()
    with pytest.raises(ValueError, match="rank is unknown"):
        get_world(world_size=2)


@pytest.mark.parametrize(
    ("rank", "world_size", "message"),
    [
        (2, 2, r"rank must be in \[0, 2\) for world_size 2, got 2"),
        (-1, 2, r"rank must be in \[0, 2\) for world_size 2, got -1"),
        (0, 0, "world_size must be >= 1, got 0"),
    ],
)
def test_explicit_validation(rank: int, world_size: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_world(rank, world_size)


def test_env_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "one")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="environment variable RANK must be an integer, got 'one'"):
        get_world()
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\)"):
        get_world()


def test_non_int_rejected() -> None:
    with pytest.raises(TypeError, match="rank must be an int"):
        get_world(True, 2)


@pytest.mark.timeout(60)
def test_initialized_process_group_wins_over_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert get_world() == (0, 1)
        assert get_world(world_size=2, rank=1) == (1, 2)
    finally:
        dist.destroy_process_group()


class _WorkerIds(IterableDataset[tuple[int, int]]):
    def __iter__(self) -> Iterator[tuple[int, int]]:
        yield get_worker()


def test_get_worker_main_process() -> None:
    assert get_worker() == (0, 1)
    got = DataLoader(_WorkerIds(), batch_size=None, num_workers=0)
    assert [tuple(x) for x in got] == [(0, 1)]  # collate turns tuples into lists


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # small CI machines
def test_get_worker_in_workers() -> None:
    got = DataLoader(_WorkerIds(), batch_size=None, num_workers=3)
    assert sorted(tuple(x) for x in got) == [(0, 3), (1, 3), (2, 3)]
