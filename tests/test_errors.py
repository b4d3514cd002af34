"""Every project error survives the two ways it crosses processes: pickling (a pack's worker pool, Ray)
and torch's DataLoader re-raise, which rebuilds a worker's exception as ``type(exc)(message)``."""

from __future__ import annotations

import importlib
import pickle
import pkgutil

import pytest

import loaders
import shardpipe
from shardpipe.errors import CorruptShardError, ShardpipeError


def project_error_types() -> list[type[ShardpipeError]]:
    for package in (shardpipe, loaders):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not module.name.endswith("__main__"):  # running the CLI is not importing it
                importlib.import_module(module.name)
    found: list[type[ShardpipeError]] = []
    todo: list[type[ShardpipeError]] = [ShardpipeError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return sorted(set(found), key=lambda c: f"{c.__module__}.{c.__qualname__}")


def test_the_walk_finds_the_errors_of_every_layer() -> None:
    names = {cls.__name__ for cls in project_error_types()}
    expected = {
        "CorruptShardError",
        "StorageError",
        "JobMismatchError",
        "SourceFileError",
        "RankTimeoutError",
    }
    assert expected <= names, expected - names


@pytest.mark.parametrize("cls", project_error_types(), ids=lambda c: c.__qualname__)
def test_every_project_error_is_rebuilt_from_its_message_and_pickles(cls: type[ShardpipeError]) -> None:
    message = "Caught it in DataLoader worker process 1.\nOriginal Traceback (most recent call last): ..."
    rebuilt = cls(message)  # what torch does in the trainer
    assert str(rebuilt) == message
    again = pickle.loads(pickle.dumps(rebuilt))
    assert type(again) is cls and str(again) == message and vars(again) == vars(rebuilt)


def test_details_survive_pickling() -> None:
    error = CorruptShardError.at("train/shard-000001.tar", "bad header", sample_index=7, offset=4096)
    assert str(error) == "corrupt shard train/shard-000001.tar, sample 7, byte 4096: bad header"
    again = pickle.loads(pickle.dumps(error))
    assert (again.shard, again.detail, again.sample_index, again.offset) == (
        "train/shard-000001.tar",
        "bad header",
        7,
        4096,
    )
