"""One end-to-end run of a transport, and the in-process timing of each step (see ``bench.transfer``)."""

from __future__ import annotations

import fcntl
import pickle
import statistics
import time
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from bench.transfer.ring import RING_SLOTS, RINGS, Ring, RingBatch
from loaders import collate_samples

TRANSPORTS = ("pipe-64k", "pipe-1m", "ring", "floor")
FLOOR_BATCH = (1, 16)  # (samples, bytes): a batch too small to cost anything but the DataLoader round trip
PIPE_BYTES = 1 << 20
PREFETCH = 4


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
    """Each worker yields ``count`` batches (its share), built once, through the ring when one is given."""

    def __init__(self, batch_size: int, sample_bytes: int, count: int, ring_id: int | None) -> None:
        self.batch_size, self.sample_bytes, self.count, self.ring_id = (
            batch_size,
            sample_bytes,
            count,
            ring_id,
        )

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        batch = make_batch(self.batch_size, self.sample_bytes, seed=worker)
        ring = RINGS[self.ring_id] if self.ring_id is not None else None
        for _ in range(self.count // workers + (worker < self.count % workers)):
            if ring is None:
                yield batch
            else:
                yield RingBatch(self.ring_id or 0, worker, *ring.write(worker, batch))


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


def run_once(
    transport: str, batch_size: int, sample_bytes: int, batches: int, warmup: int, workers: int
) -> float:
    """Batches/s the main process receives after ``warmup`` batches (``floor``: a one-sample batch through
    the 1 MiB pipe, the fixed per-batch cost of the DataLoader's queues and processes)."""
    if transport == "floor":
        batch_size, sample_bytes = FLOOR_BATCH
    ring_id = None
    if transport == "ring":
        probes = [make_batch(batch_size, sample_bytes, seed=w) for w in range(workers)]  # each worker's batch
        slot_bytes = max(p["bin"].nbytes + p["cls"].nbytes for p in probes) + 32 * (batch_size + 1) + 4096
        ring_id = len(RINGS)
        RINGS[ring_id] = Ring.create(workers, slot_bytes)  # + two offset arrays, the pad flags
    dataset = Repeat(batch_size, sample_bytes, batches + warmup, ring_id)
    loader = _Loader(
        dataset, batch_size=None, num_workers=workers, prefetch_factor=PREFETCH, collate_fn=_identity
    )
    loader.pipe_bytes = PIPE_BYTES if transport in ("pipe-1m", "floor") else None
    started, received = 0.0, 0
    for received, batch in enumerate(loader, start=1):
        if batch["bin"].nbytes <= 0:
            raise RuntimeError(f"{transport}: an empty batch arrived")
        if received == warmup:
            started = time.perf_counter()
    elapsed = time.perf_counter() - started
    if received != batches + warmup:
        raise RuntimeError(f"{transport}: {received} batches arrived, expected {batches + warmup}")
    if ring_id is not None:
        del RINGS[ring_id]
    return batches / elapsed


def components(batch_size: int, sample_bytes: int, calls: int) -> dict[str, float]:
    """Median microseconds per batch of each step, in this process."""
    batch = make_batch(batch_size, sample_bytes)
    wire = bytes(ForkingPickler.dumps(batch))
    memory = torch.empty((1, RING_SLOTS, len(wire) + 65536), dtype=torch.uint8)
    ring = Ring(memory, torch.zeros((1, 2), dtype=torch.int64))
    times: dict[str, list[int]] = {
        "pickle_us": [],
        "unpickle_us": [],
        "ring_write_us": [],
        "ring_read_us": [],
    }
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        ForkingPickler.dumps(batch)
        t1 = time.perf_counter_ns()
        pickle.loads(wire)
        t2 = time.perf_counter_ns()
        slot, layout = ring.write(0, batch)
        t3 = time.perf_counter_ns()
        ring.read(0, slot, layout)
        t4 = time.perf_counter_ns()
        for name, (a, b) in zip(times, ((t0, t1), (t1, t2), (t2, t3), (t3, t4)), strict=True):
            times[name].append(b - a)
    return {"pickled_bytes": len(wire), **{k: statistics.median(v) / 1000 for k, v in times.items()}}
