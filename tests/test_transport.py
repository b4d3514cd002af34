"""The shared-memory ring: batches through it equal those through the pipe; fallbacks; errors; cleanup."""

from __future__ import annotations

import gc
import math
import os
import pickle
import tracemalloc
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

from loaders import ShardedDataset, ShardedLoader, make_loader
from loaders.batches import Batch, RaggedBytes, collate_samples
from loaders.planning.planner import worker_sample_counts
from loaders.transfer import sizing as sz
from loaders.transfer import transport as tp
from loaders.transfer.sizing import PREFETCH, slot_bytes_for
from loaders.transfer.transport import Ring, RingBatch, RingSender, RingStalledError, Transport
from shardpipe.formats import leases
from tests.datagen import pack_dataset


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack_dataset(tmp_path_factory.mktemp("ring"), "tar", 61, max_samples=9)


@pytest.fixture(autouse=True)
def no_rings_yet() -> None:
    """Each test counts the rings it makes (rings of earlier tests may live on in their tracebacks)."""
    gc.collect()
    tp._RINGS.clear()


def make_batch(n: int, size: int, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    samples = [
        {
            "__key__": f"k{seed}-{i}",
            "bin": rng.integers(0, 256, int(rng.integers(0, size + 1)), dtype=np.uint8).tobytes(),
            "txt": b"%d" % i,
            "__pad__": bool(i % 3 == 0),
        }
        for i in range(n)
    ]
    return collate_samples(samples)


def as_lists(batch: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if isinstance(value, RaggedBytes):
            out[name] = (value.tolist(), value.offsets.tolist())
        elif isinstance(value, torch.Tensor):
            out[name] = (value.tolist(), value.dtype)
        else:
            out[name] = value
    return out


def through_pipe(message: Any) -> Any:
    return pickle.loads(bytes(ForkingPickler.dumps(message)))


def test_a_batch_through_the_ring_equals_the_batch_and_frees_its_slot_in_order() -> None:
    ring = Ring.create(num_workers=2, num_slots=3, slot_bytes=8192)
    sender = RingSender(ring)
    for step in range(7):  # wraps around the slots twice
        batch = make_batch(9, 300, seed=step)
        message = sender.send(1, batch)
        assert isinstance(message, RingBatch)
        assert len(ForkingPickler.dumps(message)) < 600  # only a descriptor crosses the pipe
        assert as_lists(through_pipe(message)) == as_lists(batch)
    assert ring.counts.tolist() == [[0, 0], [7, 7]]


def test_kept_batches_stay_intact_and_dropped_ones_lend_their_buffers() -> None:
    ring = Ring.create(num_workers=1, num_slots=2, slot_bytes=1 << 19)
    sender = RingSender(ring)

    def take(seed: int) -> Batch:
        return cast(Batch, through_pipe(sender.send(0, make_batch(9, 30_000, seed=seed))))

    def intact(batches: dict[int, Batch]) -> bool:
        return all(as_lists(b) == as_lists(make_batch(9, 30_000, seed=s)) for s, b in batches.items())

    kept = {seed: take(seed) for seed in range(5)}  # more than the slots: they are reused
    assert intact(kept)
    array = np.frombuffer(kept.pop(1)["bin"].buffer, np.uint8)  # an array of a batch's bytes keeps them
    expected = array.copy()
    kept[1] = take(1)  # the same size again: its old buffer is not free
    assert np.array_equal(array, expected)
    del kept[0]
    message = sender.send(0, make_batch(9, 30_000, seed=0))
    tracemalloc.start()
    try:
        again = through_pipe(message)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < again["bin"].nbytes / 2  # copied into the buffer the dropped batch left, not a new one
    assert intact({0: again, **kept})
    assert np.array_equal(array, expected)


def test_the_trainer_pools_as_many_buffers_as_the_ring_has_slots() -> None:
    """Messages are copied out as they arrive and wait for their turn: with a deep prefetch more of them
    are held at once than a default pool keeps, and each would otherwise be fresh memory."""
    slots = 2 * leases.POOLED_BUFFERS
    ring = Ring.create(num_workers=1, num_slots=slots, slot_bytes=1 << 19)
    sender = RingSender(ring)

    sent = [make_batch(9, 30_000, seed=s) for s in range(slots)]

    def take_all() -> list[Batch]:
        return [cast(Batch, through_pipe(sender.send(0, batch))) for batch in sent]

    held = take_all()
    size = held[0]["bin"].nbytes
    del held
    tracemalloc.start()
    try:
        held = take_all()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size  # every one copied into a buffer the first round left
    assert [as_lists(b) for b in held] == [as_lists(b) for b in sent]


def test_a_batch_larger_than_a_slot_goes_inline() -> None:
    ring = Ring.create(num_workers=1, num_slots=2, slot_bytes=1024)
    batch = make_batch(8, 600)
    message = RingSender(ring).send(0, batch)
    assert message is batch
    assert as_lists(through_pipe(message)) == as_lists(batch)
    assert ring.counts.tolist() == [[0, 0]]  # no slot taken


def test_out_of_order_descriptors_are_refused() -> None:
    ring = Ring.create(num_workers=1, num_slots=4, slot_bytes=8192)
    sender = RingSender(ring)
    first, second = sender.send(0, make_batch(3, 50)), sender.send(0, make_batch(3, 50, seed=1))
    with pytest.raises(RuntimeError, match="found batch 1, expected 0"):
        through_pipe(second)
    through_pipe(first)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_full_ring_waits_then_sends_inline_and_raises_when_nothing_is_freed() -> None:
    ring = Ring.create(num_workers=2, num_slots=2, slot_bytes=8192)
    clock = FakeClock()
    sender = RingSender(ring, wait_s=0.5, stall_s=3.0)
    parent = os.getpid  # in this test the ring was made by this process
    sent = [
        sender.send(1, make_batch(2, 10), clock=clock, sleep=clock.sleep, parent_pid=parent) for _ in range(2)
    ]
    assert all(isinstance(m, RingBatch) for m in sent)
    batch = make_batch(2, 10)
    for _ in range(5):  # full: each wait gives up after 0.5 s (fake) and the batch goes inline
        assert sender.send(1, batch, clock=clock, sleep=clock.sleep, parent_pid=parent) is batch
    assert 2.5 <= clock.now < 3.0
    with pytest.raises(RingStalledError, match=r"loader worker 1: .* freed none of 2 ring slots"):
        sender.send(1, batch, clock=clock, sleep=clock.sleep, parent_pid=parent)
    through_pipe(sent[0])  # the main frees one: waiting starts afresh
    assert isinstance(sender.send(1, batch, clock=clock, sleep=clock.sleep, parent_pid=parent), RingBatch)


def test_the_wait_raises_at_once_when_the_main_process_is_gone() -> None:
    ring = Ring.create(num_workers=1, num_slots=1, slot_bytes=8192)
    clock = FakeClock()
    ring.put(0, 0, *tp.split_batch(make_batch(2, 10)))
    with pytest.raises(
        RingStalledError, match=rf"loader worker 0: the main process \(pid {os.getpid()}\) is gone"
    ):
        ring.wait_for_slot(0, 60.0, clock=clock, sleep=clock.sleep, parent_pid=lambda: 1)
    assert clock.now == 0.0
    assert ring.wait_for_slot(0, 0.01, clock=clock, sleep=clock.sleep, parent_pid=os.getpid) is None


def loader(
    path: Path, transport: Transport, workers: int, persistent: bool, context: str | None, **kw: Any
) -> ShardedLoader:
    dataset = ShardedDataset(path, rank=1, world_size=2, seed=3, shuffle_buffer=6, block_size=2)
    return make_loader(
        dataset, 4, workers, persistent_workers=persistent, multiprocessing_context=context,
        transport=transport, **kw,
    )  # fmt: skip


def messages(loader: ShardedLoader) -> int:
    """The ring messages of one epoch: each worker's batches in chunks of ``chunk_batches``."""
    per_chunk, size = loader.sharded.options.chunk_batches, loader.samples_per_batch
    counts = worker_sample_counts(len(loader.sharded), loader.num_workers, size)
    return sum(math.ceil(math.ceil(n / size) / per_chunk) for n in counts)


@pytest.fixture
def one_batch_per_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("loaders.transfer.sizing.batches_per_chunk", lambda *_: 1)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
@pytest.mark.parametrize(("workers", "persistent"), [(1, True), (2, False), (2, True)])
def test_batches_through_the_ring_equal_batches_through_the_pipe(
    packed: Path, context: str, workers: int, persistent: bool
) -> None:
    pipe = loader(packed, "pipe", workers, persistent, context)
    ring = loader(packed, "ring", workers, persistent, context)
    for epoch in (0, 1):  # persistent workers keep their ring across epochs
        pipe.set_epoch(epoch)
        ring.set_epoch(epoch)
        expected = [as_lists(b) for b in pipe]
        assert len(tp._RINGS) == (epoch > 0 and persistent)  # the pipe loader makes none
        got = [as_lists(b) for b in ring]
        assert got == expected, (context, workers, persistent, epoch)
        assert len(got) == len(ring)
    gc.collect()
    if persistent:  # one ring for the workers' life, every written slot freed
        (live,) = tp._RINGS.values()
        assert live.counts[:, 0].tolist() == live.counts[:, 1].tolist()
        assert int(live.counts[:, 0].sum()) == 2 * messages(ring) > 0
        del live
    del ring
    gc.collect()
    assert len(tp._RINGS) == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_an_abandoned_epoch_frees_its_slots_before_the_next(packed: Path, context: str) -> None:
    """Persistent workers: batches left in flight by a ``break`` are read (and freed) when the next epoch
    starts, so the counters stay in step and the next epoch is exact."""
    pipe, ring = loader(packed, "pipe", 2, True, context), loader(packed, "ring", 2, True, context)
    iterator = iter(ring)
    next(iterator), next(iterator)  # then abandoned, with batches in flight
    pipe.set_epoch(1)
    ring.set_epoch(1)
    assert [as_lists(b) for b in ring] == [as_lists(b) for b in pipe]
    (live,) = tp._RINGS.values()
    assert live.counts[:, 0].tolist() == live.counts[:, 1].tolist()


@pytest.mark.timeout(120)
def test_a_batch_larger_than_a_slot_falls_back_and_still_equals(
    packed: Path, monkeypatch: pytest.MonkeyPatch, one_batch_per_message: None
) -> None:
    batches = list(loader(packed, "pipe", 2, False, "fork"))
    sizes = sorted(sum(-(-len(p) // 8) * 8 for p in tp.split_batch(b)[0]) for b in batches)
    slot = sizes[-1] - 8  # the largest batches go inline, the others through the ring
    monkeypatch.setattr("loaders.transfer.sizing.slot_bytes_for", lambda expected, batch_size: slot)
    ring = loader(packed, "ring", 2, True, "fork")
    assert [as_lists(b) for b in ring] == [as_lists(b) for b in batches]
    (live,) = tp._RINGS.values()
    assert 0 < int(live.counts[:, 0].sum()) == sum(size <= slot for size in sizes) < len(sizes)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_resume_is_exact_with_the_ring(packed: Path, context: str) -> None:
    expected = [as_lists(b) for b in loader(packed, "pipe", 2, False, context)]
    run = loader(packed, "ring", 2, False, context)
    iterator = iter(run)
    consumed = [as_lists(next(iterator)) for _ in range(3)]
    state = run.state_dict()
    del iterator
    resumed = loader(packed, "ring", 2, False, context)
    resumed.load_state_dict(state)
    assert consumed + [as_lists(b) for b in resumed] == expected


def test_no_ring_without_workers_or_for_the_per_sample_path(packed: Path) -> None:
    assert [as_lists(b) for b in loader(packed, "ring", 0, False, None)]
    assert len(tp._RINGS) == 0
    with_collate = loader(packed, "ring", 1, False, "fork", collate_fn=collate_samples)
    assert [as_lists(b) for b in with_collate]
    assert len(tp._RINGS) == 0
    assert loader(packed, "auto", 1, False, "fork")._make_ring() is not None  # a chunk of many batches


def test_auto_sends_small_single_batches_through_the_pipe(packed: Path, one_batch_per_message: None) -> None:
    assert loader(packed, "auto", 1, False, "fork")._make_ring() is None


@pytest.mark.timeout(120)
def test_auto_takes_the_ring_for_large_batches(tmp_path: Path) -> None:
    """Samples of ~20 KiB in batches of 4: the manifest predicts more than ``AUTO_MIN_BATCH_BYTES``."""
    path = pack_dataset(tmp_path, "lmdb", 24, max_samples=8, size=20_000)
    auto, pipe = loader(path, "auto", 2, True, "fork"), loader(path, "pipe", 2, True, "fork")
    assert auto.expected_batch_bytes() >= sz.AUTO_MIN_BATCH_BYTES
    assert [as_lists(b) for b in auto] == [as_lists(b) for b in pipe]
    (live,) = tp._RINGS.values()
    assert int(live.counts[:, 1].sum()) == messages(auto)  # every chunk came through the ring


def test_the_default_prefetch_gives_way_where_its_ring_would_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window-deep prefetch takes more shared memory; where /dev/shm is short the loader keeps the ring
    (worth more) at the usual depth rather than falling back to the pipe."""
    path = pack_dataset(tmp_path, "tar", 24, max_samples=8, size=2_000)  # read in whole windows

    def loader(**kwargs: Any) -> ShardedLoader:
        return make_loader(ShardedDataset(path, shuffle_buffer=8192), 64, 2, **kwargs)

    deep = loader()
    assert deep.prefetch_factor > PREFETCH and deep.expected_batch_bytes() >= sz.AUTO_MIN_BATCH_BYTES
    per_chunk = deep.sharded.options.chunk_batches
    slot = slot_bytes_for(deep.expected_batch_bytes() * per_chunk, 64 * per_chunk)
    shallow_ring = 2 * (PREFETCH + sz.EXTRA_SLOTS) * slot
    monkeypatch.setattr("loaders.loader.shm_free_bytes", lambda: int(shallow_ring / sz.SHM_SHARE))
    short = loader()  # sized where /dev/shm holds only the shallow ring
    ring = short._make_ring()
    assert ring is not None and ring.memory.shape[:2] == (2, PREFETCH + sz.EXTRA_SLOTS)
    assert short.prefetch_factor == PREFETCH
    mine = loader(prefetch_factor=9)  # the user's choice is kept
    assert mine._make_ring() is None and mine.prefetch_factor == 9  # and "auto" takes the pipe


def test_make_loader_refuses_an_unknown_transport(packed: Path) -> None:
    with pytest.raises(ValueError, match="transport must be one of auto, pipe, ring, got 'shm'"):
        loader(packed, "shm", 0, False, None)  # type: ignore[arg-type]


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def shm_entries() -> set[str]:
    """/dev/shm's entries but semaphores (``sem.*``: multiprocessing's queues under spawn, joblib's), which
    the ring never makes; a named ring would show up as torch's ``torch_<pid>_...``."""
    return {name for name in os.listdir("/dev/shm") if not name.startswith("sem.")}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_nothing_is_left_in_dev_shm_or_open_after_the_loader_is_dropped(packed: Path, context: str) -> None:
    list(loader(packed, "ring", 2, True, context))  # starts what the process keeps anyway (resource sharer)
    gc.collect()
    shm, fds = shm_entries(), open_fds()
    run = loader(packed, "ring", 2, True, context)
    iterator = iter(run)
    next(iterator)
    assert len(tp._RINGS) == 1
    assert shm_entries() <= shm  # anonymous: nothing named, even while it runs
    list(iterator)
    del iterator, run
    gc.collect()
    assert len(tp._RINGS) == 0
    assert shm_entries() <= shm
    assert open_fds() <= fds
