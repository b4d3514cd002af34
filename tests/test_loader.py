"""make_loader and ShardedLoader: exact length, the forgotten set_epoch, state_dict / load_state_dict."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from loaders import ShardedDataset, ShardedLoader, make_loader
from loaders.batches import RaggedBytes, collate_samples
from loaders.decoding import column_decoder
from loaders.loader import RESULT_PIPE_BYTES, enlarge_result_pipe, expected_batch_bytes
from loaders.transfer.sizing import PREFETCH, batches_per_chunk
from tests.datagen import pack_dataset
from tests.test_dataset import damage

FORMATS = ["tar", "lmdb", "tfrecord"]


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packed")
    return {fmt: pack_dataset(root, fmt, 47, max_samples=7) for fmt in FORMATS}


def test_make_loader_length_is_exact_and_epochs_advance_without_set_epoch(
    packed: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    dataset = ShardedDataset(packed["lmdb"], rank=2, world_size=3, seed=0)
    for num_workers, batch_size in [(0, 4), (2, 4), (1, 5), (2, 3), (2, 64)]:
        loader = make_loader(dataset, batch_size=batch_size, num_workers=num_workers)
        batches = list(loader)
        assert len(batches) == len(loader) == -(-len(dataset) // batch_size)
        assert all(len(b["__key__"]) == batch_size for b in batches[:-1])
    loader = make_loader(dataset, batch_size=4, num_workers=2)
    with caplog.at_level("WARNING", logger="loaders"):
        first = [k for b in loader for k in b["__key__"]]
        second = [k for b in loader for k in b["__key__"]]
    assert first != second  # a new epoch: another order (and, on this rank, another share)
    assert "set_epoch() was not called" in caplog.text


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_yields_exactly_the_remaining_batches(packed: dict[str, Path], num_workers: int) -> None:
    def loader() -> torch.utils.data.DataLoader:
        dataset = ShardedDataset(packed["tfrecord"], rank=0, world_size=2, seed=9, shuffle_buffer=5)
        return make_loader(dataset, batch_size=3, num_workers=num_workers, persistent_workers=False)

    reference = loader()
    reference.set_epoch(4)
    expected = [b["__key__"] for b in reference]
    for k in (0, 1, 3, len(expected) - 1):
        run = loader()
        run.set_epoch(4)
        iterator = iter(run)
        consumed = [next(iterator)["__key__"] for _ in range(k)]
        state = json.loads(json.dumps(run.state_dict()))
        del iterator
        resumed = loader()
        resumed.load_state_dict(state)
        resumed.set_epoch(4)  # the usual loop sets the epoch again: the resume point must survive it
        assert len(resumed) == len(expected)  # the epoch as trainers count it, consumed batches included
        rest = [b["__key__"] for b in resumed]
        assert consumed + rest == expected, k
        assert (resumed.state_dict()["epoch"], resumed.state_dict()["segments"]) == (5, [])  # complete
        resumed.set_epoch(4)
        assert [b["__key__"] for b in resumed] == expected  # the next pass is a whole epoch again


def test_resume_refuses_another_dataset_or_seed(packed: dict[str, Path]) -> None:
    state = make_loader(ShardedDataset(packed["tar"], rank=0, world_size=2), 4, 0).state_dict()
    with pytest.raises(ValueError, match=r"found seed=0 in the saved state, expected 3"):
        make_loader(ShardedDataset(packed["tar"], rank=0, world_size=2, seed=3), 4, 0).load_state_dict(state)
    with pytest.raises(ValueError, match="found manifest="):
        make_loader(ShardedDataset(packed["lmdb"], rank=0, world_size=2), 4, 0).load_state_dict(state)
    with pytest.raises(ValueError, match="found state version 7"):
        make_loader(ShardedDataset(packed["tar"], rank=0, world_size=2), 4, 0).load_state_dict({"version": 7})
    make_loader(ShardedDataset(packed["tar"], rank=0, world_size=3), 4, 0).load_state_dict(state)  # elastic


def test_bytes_batches_travel_as_one_buffer(packed: dict[str, Path]) -> None:
    dataset = ShardedDataset(packed["tar"], rank=0, world_size=1, shuffle=False)
    batch = next(iter(make_loader(dataset, batch_size=5, num_workers=2)))
    samples = list(dataset)[:5]
    assert batch["bin"].tolist() == [s["bin"] for s in samples]
    assert batch["__key__"] == [s["__key__"] for s in samples]
    assert batch["__pad__"].dtype == torch.bool


def pipe_size(loader: torch.utils.data.DataLoader) -> int:
    iterator = loader._get_iterator()  # what DataLoader.__iter__ builds
    try:
        return fcntl.fcntl(iterator._worker_result_queue._reader.fileno(), fcntl.F_GETPIPE_SZ)
    finally:
        iterator._shutdown_workers()


def test_result_pipe_is_enlarged_on_this_torch(packed: dict[str, Path]) -> None:
    """The enlargement reaches into DataLoader's private queue: if a torch release moves it, this fails
    (rather than the loader silently losing the speed-up), and the loader still runs on the plain pipe."""
    dataset = ShardedDataset(packed["tar"], rank=0, world_size=1)
    assert pipe_size(make_loader(dataset, 4, num_workers=1)) >= RESULT_PIPE_BYTES
    plain = make_loader(dataset, 4, num_workers=1, enlarge_pipe=False)
    assert pipe_size(plain) < RESULT_PIPE_BYTES
    assert sum(len(b["__key__"]) for b in plain) == 47
    assert enlarge_result_pipe(object()) is False  # a queue it cannot find: no error, the plain pipe


def test_make_loader_configures_a_dataset_sharing_the_epoch(packed: dict[str, Path]) -> None:
    dataset = ShardedDataset(packed["tar"], rank=0, world_size=1)
    loader = make_loader(dataset, batch_size=8, num_workers=0)
    assert loader.sharded is not dataset and loader.sharded.options.batch_size == 8
    assert dataset.options.batch_size is None  # the caller's dataset is not mutated
    dataset.set_epoch(3)
    assert loader.sharded.epoch == 3
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        make_loader(dataset, batch_size=0)


def test_default_prefetch_holds_a_window_of_each_workers_messages(
    packed: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker hands a window over message by message: by default it keeps all of them ready, and one
    more, so it can read its next window at once (``loaders.transfer.sizing.prefetch_for``)."""
    monkeypatch.setattr("loaders.transfer.sizing.batches_per_chunk", lambda *_: 2)
    dataset = ShardedDataset(packed["tar"], shuffle_buffer=60)
    assert make_loader(dataset, 5, 2).prefetch_factor == 60 // (5 * 2) + 1
    assert make_loader(dataset, 5, 2, prefetch_factor=3).prefetch_factor == 3  # the user's choice
    assert make_loader(dataset, 5, 0).prefetch_factor is None  # no workers, no prefetch
    assert make_loader(dataset, 5, 2, collate_fn=collate_samples).prefetch_factor == 60 // 5 + 1


def test_a_message_never_spans_two_windows_by_default(packed: dict[str, Path]) -> None:
    """Windows of 12 batches: messages of a number of batches that divides 12 (one spanning two windows
    would be copied together in the worker)."""
    dataset = ShardedDataset(packed["tar"], shuffle_buffer=60)
    assert 12 % make_loader(dataset, 5, 2).sharded.options.chunk_batches == 0
    odd = make_loader(ShardedDataset(packed["tar"], shuffle_buffer=7 * 8), 5, 2)  # not whole batches
    assert odd.sharded.options.chunk_batches == batches_per_chunk(5, expected_batch_bytes(odd.sharded, 5))


def test_large_samples_on_the_batch_path_keep_one_message_ahead(tmp_path: Path) -> None:
    """Their windows land a message at a time (``WindowReader``): nothing comes at once to hold."""
    dataset = ShardedDataset(pack_dataset(tmp_path, "tar", 8, size=20_000), shuffle_buffer=60)
    assert not make_loader(dataset, 5, 2).sharded.hands_over_whole_windows
    assert make_loader(dataset, 5, 2).prefetch_factor == PREFETCH
    assert make_loader(dataset, 5, 2, collate_fn=collate_samples).prefetch_factor == 60 // 5 + 1


def byte_sums(column: RaggedBytes) -> torch.Tensor:
    """A column decoder: each item's byte sum, as one tensor."""
    return torch.tensor([sum(item) for item in column])


def as_lists(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, list) else v.tolist() for k, v in batch.items()}


@pytest.fixture(params=[None, 1, 2, 3], ids=["chunks-default", "chunks-1", "chunks-2", "chunks-3"])
def per_chunk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int | None:
    """Batches per worker message (``loaders.transfer.chunks``): the default rule, or forced."""
    if request.param is not None:
        monkeypatch.setattr("loaders.transfer.sizing.batches_per_chunk", lambda *_: request.param)
    return request.param  # type: ignore[no-any-return]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize("decode", [None, "decoded"], ids=["raw", "decoded"])
def test_batch_path_equals_the_per_sample_path_batch_by_batch(
    packed: dict[str, Path], fmt: str, num_workers: int, per_chunk: int | None, decode: str | None
) -> None:
    """Raw fields, or a built-in and a column decoder of the user's: workers build batches from columns
    (decoded a column at a time), several per message; with a collate_fn the DataLoader collates samples
    (decoded one by one), one batch per message."""

    def run(**kwargs: Any) -> list[dict[str, Any]]:
        decoders = {"cls": "cls", "txt": column_decoder(byte_sums)} if decode else None
        dataset = ShardedDataset(packed[fmt], rank=1, world_size=2, seed=4, shuffle_buffer=6, block_size=2,
                                 decode=decoders)  # fmt: skip
        loader = make_loader(dataset, 5, num_workers, persistent_workers=False, **kwargs)
        assert loader.sharded.batched == (not kwargs)
        if per_chunk is not None and num_workers and not kwargs:
            assert loader.sharded.options.chunk_batches == per_chunk
        loader.set_epoch(1)
        batches = [as_lists(b) for b in loader]
        assert len(batches) == len(loader)
        if decode:
            assert all(isinstance(b["cls"][0], int) and isinstance(b["txt"][0], int) for b in batches)
        return batches

    assert run() == run(collate_fn=collate_samples)


def test_a_loader_without_workers_reads_a_dataset_taken_from_one_with_workers(
    packed: dict[str, Path],
) -> None:
    """``loader.sharded`` of a loader with workers is configured for chunks; a loader without workers
    sends none, so it must reset that."""
    dataset = ShardedDataset(packed["tar"], rank=0, world_size=1, seed=5, shuffle_buffer=7)
    with_workers = make_loader(dataset, 3, 2, persistent_workers=False)
    assert with_workers.sharded.options.chunk_batches > 1
    expected = [as_lists(b) for b in make_loader(dataset, 3, 0)]
    dataset.set_epoch(0)  # the loaders share the dataset's epochs: read the same one again
    assert [as_lists(b) for b in make_loader(with_workers.sharded, 3, 0)] == expected != []


@pytest.mark.parametrize("fmt", FORMATS)
def test_skipped_samples_are_flagged_and_counted_the_same_on_both_paths(
    tmp_path: Path, fmt: str, per_chunk: int | None
) -> None:
    out = pack_dataset(tmp_path, fmt, 20, max_samples=10)
    damage(out, fmt)

    def run(**kwargs: Any) -> tuple[list[dict[str, Any]], int]:
        dataset = ShardedDataset(out, rank=0, world_size=1, seed=1, shuffle_buffer=8, on_error="skip")
        loader = make_loader(dataset, 3, 2, persistent_workers=False, **kwargs)
        return [as_lists(b) for b in loader], dataset.num_errors

    batched, errors = run()
    assert (batched, errors) == run(collate_fn=collate_samples)
    assert errors == (10 if fmt == "lmdb" else 1) == sum(sum(b["__pad__"]) for b in batched)


@pytest.mark.parametrize("consumed_batches", [1, 5])
def test_batch_path_resumes_exactly(
    packed: dict[str, Path], per_chunk: int | None, consumed_batches: int
) -> None:
    """Also when the save falls inside a chunk: the resumed workers cut their chunks afresh."""

    def loader() -> ShardedLoader:
        dataset = ShardedDataset(packed["lmdb"], rank=0, world_size=1, seed=2, shuffle_buffer=7)
        return make_loader(dataset, batch_size=4, num_workers=2, persistent_workers=False)

    expected = [as_lists(b) for b in loader()]
    run = loader()
    iterator = iter(run)
    consumed = [as_lists(next(iterator)) for _ in range(consumed_batches)]
    state = run.state_dict()
    del iterator
    resumed = loader()
    resumed.load_state_dict(state)
    assert consumed + [as_lists(b) for b in resumed] == expected
