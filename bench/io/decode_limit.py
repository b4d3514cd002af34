"""``decode-limit``: the fused crop alone, the ceiling of any loader that runs it.

``RandomResizedCrop(224)`` is called on in-memory batch columns (``RaggedBytes.from_list``) of the same
JPEG bytes the loaders read, with their keys and a ``DecodeContext``, in a tight loop, in as many
processes as the loaders have workers, started together (a barrier) after one untimed batch each. No
file, no shard, no shuffle, no transfer between processes: what is left is decoding and cropping. Each
process times its own loop; samples/s are summed over processes, CPU seconds are each process's own.
Batches cycle over the photos, the epoch of the context advancing each cycle (other crops, as a loader's
next epoch would draw).
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass
from typing import Any

import torch

from loaders import RandomResizedCrop
from loaders.batches import RaggedBytes
from loaders.decoding import DecodeContext
from loaders.reading.decode import ColumnDecoder

JOIN_TIMEOUT_S = 600.0
BARRIER_TIMEOUT_S = 120.0  # a process that failed before the start must not hang the other
WARMUP_EPOCH = 1 << 20  # the untimed batch's draws: an epoch no timed batch uses


@dataclass(frozen=True, slots=True)
class LimitRun:
    """One decode-limit run: per process (samples, seconds, CPU seconds)."""

    processes: tuple[tuple[int, float, float], ...]

    @property
    def samples(self) -> int:
        return sum(p[0] for p in self.processes)

    @property
    def samples_per_s(self) -> float:
        return sum(n / s for n, s, _ in self.processes if s > 0)

    @property
    def cpu_s(self) -> float:
        return sum(p[2] for p in self.processes)

    @property
    def seconds(self) -> float:
        return max(p[1] for p in self.processes)


def columns_of(jpegs: list[bytes], keys: list[str], batch_size: int) -> list[tuple[RaggedBytes, list[str]]]:
    """The photos as batch columns, as a loader's batch path hands them to the decoder."""
    return [
        (RaggedBytes.from_list(jpegs[i : i + batch_size]), keys[i : i + batch_size])
        for i in range(0, len(jpegs), batch_size)
    ]


def decode_limit(
    columns: list[tuple[RaggedBytes, list[str]]],
    num_processes: int,
    num_samples: int,
    crop: ColumnDecoder | None = None,
) -> LimitRun:
    """About ``num_samples`` crops (whole batches), split evenly over ``num_processes`` processes (0: in
    this one); the columns reach the processes by fork, never pickled."""
    crop = crop or RandomResizedCrop(224)
    per_batch = len(columns[0][0])
    num_batches = max(1, -(-num_samples // per_batch))
    plan = [(i % len(columns), i // len(columns)) for i in range(num_batches)]  # (column, epoch)
    if num_processes == 0:
        return LimitRun((_loop(columns, plan, crop),))
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(num_processes, timeout=BARRIER_TIMEOUT_S)
    results = context.SimpleQueue()
    processes = [
        context.Process(target=_child, args=(columns, plan[p::num_processes], crop, barrier, results))
        for p in range(num_processes)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(JOIN_TIMEOUT_S)
    codes = [process.exitcode for process in processes]
    if codes != [0] * num_processes:
        for process in processes:
            if process.is_alive():
                process.kill()
        raise RuntimeError(f"decode-limit: processes exited with {codes}, expected all 0")
    return LimitRun(tuple(results.get() for _ in processes))


def _child(
    columns: list[Any], plan: list[tuple[int, int]], crop: ColumnDecoder, barrier: Any, results: Any
) -> None:
    torch.set_num_threads(1)  # as in a DataLoader worker
    column, keys = columns[plan[0][0]]
    crop(column, keys, DecodeContext(epoch=WARMUP_EPOCH))  # untimed: imports, first allocations
    barrier.wait()
    results.put(_loop(columns, plan, crop))


def _loop(
    columns: list[tuple[RaggedBytes, list[str]]], plan: list[tuple[int, int]], crop: ColumnDecoder
) -> tuple[int, float, float]:
    samples, start, cpu = 0, time.perf_counter(), time.process_time()
    for index, epoch in plan:
        column, keys = columns[index]
        crop(column, keys, DecodeContext(seed=0, epoch=epoch))
        samples += len(column)
    return samples, time.perf_counter() - start, time.process_time() - cpu
