"""One end-to-end run of a transport, and the in-process timing of each step (see ``bench.transfer``)."""

from __future__ import annotations

import fcntl
import statistics
import time
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from loaders.batches import RaggedBytes, collate_samples
from loaders.transfer.sizing import EXTRA_SLOTS, slot_bytes_for
from loaders.transfer.transport import Layout, Ring, RingSender, split_batch

TRANSPORTS = ("pipe-64k", "pipe-1m", "ring", "floor")
FLOOR_BATCH = (1, 16)  # (samples, bytes): a batch too small to cost anything but the DataLoader round trip
PIPE_BYTES = 1 << 20
PREFETCH = 4
RING_SLOTS = PREFETCH + EXTRA_SLOTS  # as make_loader sizes it


def make_batch(batch_size: int, sample_bytes: int, seed: int = 0) -> Any:
    """One batch as shardpipe's loader collates it: sizes +-25% around ``sample_bytes``."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(sample_bytes * 3 // 4, sample_bytes * 5 // 4 + 1, size=batch_size)
    pool = rng.integers(0, 256, size=int(sizes.max()), dtype=np.uint8).tobytes()
    samples = [
        {
            "__key__": f"c{i % 100:03d}/{i:06d}",
            "bin": pool[: int(n)],
            "cls": b"%d" % (i % 100),
            "__pad__": False,
        }
        for i, n in enumerate(sizes)
    ]
    return collate_samples(samples)


class Repeat(IterableDataset[Any]):
    """Each worker yields ``count`` batches (its share), built once."""

    def __init__(self, batch_size: int, sample_bytes: int, count: int) -> None:
        self.batch_size, self.sample_bytes, self.count = batch_size, sample_bytes, count

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        batch = make_batch(self.batch_size, self.sample_bytes, seed=worker)
        for _ in range(self.count // workers + (worker < self.count % workers)):
            yield batch


def _identity(item: Any) -> Any:
    return item


class _Loader(DataLoader[Any]):
    pipe_bytes: int | None = None

    def _get_iterator(self) -> Any:
        iterator: Any = super()._get_iterator()
        if self.pipe_bytes:  # as loaders.loader does; DataLoader-internal: fails loudly if torch renames it
            reader = iterator._worker_result_queue._reader
            fcntl.fcntl(reader.fileno(), fcntl.F_SETPIPE_SZ, self.pipe_bytes)
        return iterator


def loader_for(
    transport: str, batch_size: int, sample_bytes: int, count: int, workers: int
) -> DataLoader[Any]:
    """A real DataLoader whose ``workers`` yield ``count`` batches between them through ``transport``
    (``floor``: one-sample batches of :data:`FLOOR_BATCH`, whatever the sizes asked for)."""
    if transport == "floor":
        batch_size, sample_bytes = FLOOR_BATCH
    collate: Any = _identity
    if transport == "ring":  # the loaders' own ring, sized as make_loader sizes it
        ring = Ring.create(workers, RING_SLOTS, slot_bytes_for(batch_size * sample_bytes, batch_size))
        collate = RingSender(ring)
    dataset = Repeat(batch_size, sample_bytes, count)
    loader = _Loader(
        dataset, batch_size=None, num_workers=workers, prefetch_factor=PREFETCH, collate_fn=collate
    )
    loader.pipe_bytes = PIPE_BYTES if transport in ("pipe-1m", "floor", "ring") else None
    return loader


def run_once(
    transport: str, batch_size: int, sample_bytes: int, batches: int, warmup: int, workers: int
) -> float:
    """Batches/s the main process receives after ``warmup`` batches (``floor``: a one-sample batch through
    the 1 MiB pipe, the fixed per-batch cost of the DataLoader's queues and processes)."""
    loader = loader_for(transport, batch_size, sample_bytes, batches + warmup, workers)
    started, received = 0.0, 0
    for received, batch in enumerate(loader, start=1):
        if batch["bin"].nbytes <= 0:
            raise RuntimeError(f"{transport}: an empty batch arrived")
        if received == warmup:
            started = time.perf_counter()
    elapsed = time.perf_counter() - started
    if received != batches + warmup:
        raise RuntimeError(f"{transport}: {received} batches arrived, expected {batches + warmup}")
    return batches / elapsed


def components(batch_size: int, sample_bytes: int, calls: int) -> dict[str, float]:
    """Median microseconds per batch of each step, in this process. ``ring_view_us`` hands out views of
    the slot instead of copies (what a zero-copy ring would cost the main; not what the loaders do)."""
    batch = make_batch(batch_size, sample_bytes)
    wire = bytes(ForkingPickler.dumps(batch))
    ring = Ring.create(1, RING_SLOTS, slot_bytes_for(batch_size * sample_bytes, batch_size))
    times: dict[str, list[int]] = {
        "pickle_us": [],
        "unpickle_us": [],
        "ring_write_us": [],
        "ring_read_us": [],
        "ring_view_us": [],
    }
    layout = split_batch(batch)[1]
    for seq in range(0, 2 * calls, 2):
        t0 = time.perf_counter_ns()
        ForkingPickler.dumps(batch)
        t1 = time.perf_counter_ns()
        ForkingPickler.loads(wire)  # what the DataLoader's result queue does with a batch
        t2 = time.perf_counter_ns()
        ring.put(0, seq, *split_batch(batch))
        t3 = time.perf_counter_ns()
        ring.take(0, seq, layout)
        t4 = time.perf_counter_ns()
        ring.put(0, seq + 1, *split_batch(batch))
        t5 = time.perf_counter_ns()
        _view(ring, seq + 1, layout)
        t6 = time.perf_counter_ns()
        spans = ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t5, t6))
        for name, (a, b) in zip(times, spans, strict=True):
            times[name].append(b - a)
    return {"pickled_bytes": len(wire), **{k: statistics.median(v) / 1000 for k, v in times.items()}}


def _view(ring: Ring, seq: int, layout: Layout) -> dict[str, Any]:
    """``Ring.take`` without the copies: views of the slot (then freed at once, so only for timing)."""
    source = ring.slot(0, seq)
    batch: dict[str, Any] = {}
    pos = 0
    for name, kind, info in layout:
        if kind == "ragged":
            size, count = info
            buffer, pos = source[pos : pos + size], pos + -(-size // 8) * 8
            batch[name] = RaggedBytes(buffer.data, source[pos : pos + 8 * count].view(np.int64))
            pos += 8 * count
        elif kind == "tensor":
            dtype, shape = np.dtype(info[0]), info[1]
            size = dtype.itemsize * int(np.prod(shape))
            batch[name] = torch.from_numpy(source[pos : pos + size].view(dtype).reshape(shape))
            pos += -(-size // 8) * 8
        else:
            batch[name] = info
    ring.counts[0, 1] = seq + 1
    return batch
