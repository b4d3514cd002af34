"""Plan-only cases: one worker's first window at a given scale, each measured in a fresh process."""

from __future__ import annotations

import gc
import time
import tracemalloc
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

SHARD_SAMPLES = 10_000
WORKERS = 8
BATCH = 256
SEED = 0
EPOCH = 1


@dataclass(frozen=True, slots=True)
class Case:
    """One plan: ``samples`` per epoch over ``sources`` (1: a single dataset), ``world`` ranks."""

    contender: str  # "layout-3", "layout-2", "grain"
    samples: int
    sources: int
    world: int

    @property
    def label(self) -> str:
        kind = "dataset" if self.sources == 1 else f"mixture of {self.sources}"
        return f"{self.contender} {kind} N=1e{round(np.log10(self.samples))} world {self.world}"


def shard_table(samples: int) -> np.ndarray:
    """Shards of ``SHARD_SAMPLES``, the last one shorter."""
    count = -(-samples // SHARD_SAMPLES)
    sizes = np.full(count, SHARD_SAMPLES, dtype=np.int64)
    sizes[-1] = samples - (count - 1) * SHARD_SAMPLES
    return sizes


def last_worker(samples: int, world: int) -> int:
    """The last of a rank's workers that holds samples (at world 1,024 a rank may hold fewer batches
    than workers)."""
    from loaders.planning.planner import samples_per_rank, worker_sample_counts

    counts = worker_sample_counts(samples_per_rank(samples, world, "pad"), WORKERS, BATCH)
    return max(w for w, n in enumerate(counts) if n > 0)


def measure(case: Case, *, traced: bool) -> dict[str, Any]:
    """Run ``case`` once, cold (the caller gives it a fresh process): its time untraced, or its peak
    traced memory (tracemalloc slows allocation, so the two are separate runs)."""
    tables = [shard_table(max(case.samples // case.sources, 1)) for _ in range(case.sources)]
    prepared = PREPARE[case.contender](case, tables)
    gc.collect()
    if traced:
        tracemalloc.start()
    started = time.perf_counter()
    held = prepared()
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if traced else 0
    tracemalloc.stop()
    measured = {"peak_mb": peak / 2**20} if traced else {"first_window_s": seconds}
    return {**asdict(case), "label": case.label, **measured, "window_samples": held}


def _shardpipe(case: Case, tables: list[np.ndarray]) -> Any:
    from loaders.planning.elastic import epoch_samples
    from loaders.planning.mixture import SourceTable, cursor_runs, epoch_samples_of, first_cursors
    from loaders.planning.plan import plan_windows
    from loaders.planning.planner import PlanConfig, window_permutation
    from loaders.planning.weights import epoch_mix

    layout = 3 if case.contender == "layout-3" else 2
    rank, worker = case.world - 1, last_worker(case.samples, case.world)
    if case.sources == 1:
        config = PlanConfig(case.world, WORKERS, seed=SEED, batch_size=BATCH, layout=layout)

        def single() -> int:
            sequence = epoch_samples(tables[0], config, (), EPOCH)
            windows = plan_windows(sequence, config, epoch=EPOCH, rank=rank, worker_index=worker)
            window = windows[0]
            return len(window.permutation())

        return single
    names = [f"s{i}" for i in range(case.sources)]
    weights = np.random.default_rng(SEED).dirichlet(np.ones(case.sources))
    sizes = [int(t.sum()) for t in tables]
    config = PlanConfig(case.world, WORKERS, seed=SEED, batch_size=BATCH, block_size=1, permute_blocks=False,
                        layout=layout)  # fmt: skip
    table = SourceTable.of(tables, [4] * case.sources, True, SEED)  # a Mixture builds it once

    def mixture() -> int:
        mixes = [epoch_mix(dict(zip(names, weights, strict=True)), names, sizes, case.samples)] * (EPOCH + 1)
        cursors = first_cursors(mixes[:EPOCH], case.sources)
        sequence = epoch_samples_of(mixes[EPOCH], SEED, EPOCH, layout)
        windows = plan_windows(sequence, config, epoch=EPOCH, rank=rank, worker_index=worker)
        window = windows[0]
        window_permutation(window.seed, len(window))
        if layout == 3:  # every source's samples of the window located at once, as the Mixture does
            rows = np.array(window.runs, dtype=np.int64).reshape(-1, 4)
            lengths = rows[:, 2] - rows[:, 1]
            owner = np.repeat(rows[:, 0], lengths)
            j = np.repeat(rows[:, 1] - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
            shard, _ = table.locate(owner, np.asarray(cursors)[owner] + j)
            return len(shard)
        located = 0
        for source, j0, j1, _ in window.runs:  # each source's cursor stretch, row by row
            begin, end = cursors[source] + j0, cursors[source] + j1
            found = cursor_runs(tables[source].tolist(), 4, True, SEED, source, begin, end)
            located += int((found[:, 2] - found[:, 1]).sum())
        return located

    return mixture


def _grain(case: Case, tables: list[np.ndarray]) -> Any:
    """Grain's ``IndexSampler`` (a stateless index shuffle over records, ranks as its shards): the global
    indices its DataLoader gives the last worker of the last rank, as many as our first window holds (a
    shuffle buffer's worth)."""
    import grain.python as grain

    from loaders.planning.planner import DEFAULT_SHUFFLE_BUFFER

    rank, worker = case.world - 1, last_worker(case.samples, case.world)
    options = grain.ShardOptions(shard_index=rank, shard_count=case.world, drop_remainder=False)
    first, stride = rank + worker * case.world, case.world * WORKERS  # grain's DataLoader's order
    count = min(DEFAULT_SHUFFLE_BUFFER, -(-max(case.samples - first, 0) // stride))

    def single() -> int:
        sampler = grain.IndexSampler(case.samples, options, shuffle=True, num_epochs=1, seed=SEED)
        keys = [sampler[first + i * stride].record_key for i in range(count)]
        return len(keys)

    return single


PREPARE = {"layout-3": _shardpipe, "layout-2": _shardpipe, "grain": _grain}
