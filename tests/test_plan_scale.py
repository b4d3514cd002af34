"""Layout 3 at scale and in the corners the earlier layouts missed: the plan alone over ten million
samples, the epoch's tail and order on a single shard."""

from __future__ import annotations

import itertools

import numpy as np

from loaders.planning.elastic import epoch_samples
from loaders.planning.plan import plan_windows, window_blocks
from loaders.planning.planner import PlanConfig, samples_per_rank, yield_order


def expanded(rows: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Block rows -> each sample's global id and pad flag, vectorised."""
    lengths = rows[:, 2] - rows[:, 1]
    firsts = offsets[rows[:, 0]] + rows[:, 1]
    ids = np.repeat(firsts - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
    return ids, np.repeat(rows[:, 3], lengths)


def test_ten_million_samples_over_64_ranks_of_8_workers_each_once() -> None:
    """The union of every (rank, worker)'s windows is each sample once, the pads flagged: uneven shards,
    checked window by window as the workers would compute them."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 15_000, size=1000)
    sizes[-1] += 10**7 - sizes.sum()  # N = 10^7 exactly, the last shard larger
    total, world, workers = int(sizes.sum()), 64, 8
    config = PlanConfig(world, workers, seed=5, batch_size=256, shuffle_buffer=1 << 16)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    sequence = epoch_samples(sizes, config, (), epoch=3)
    real, pads = [], 0
    for rank in range(world):
        for worker in range(workers):
            for rows, _ in window_blocks(sequence, config, epoch=3, rank=rank, worker_index=worker):
                ids, is_pad = expanded(rows, offsets)
                real.append(ids[is_pad == 0])
                pads += int(is_pad.sum())
    seen = np.bincount(np.concatenate(real), minlength=total)
    assert len(seen) == total and seen.min() == 1 and seen.max() == 1
    assert pads == world * samples_per_rank(total, world, "pad") - total


def test_one_shard_drops_another_tail_and_reorders_every_epoch() -> None:
    """17 samples in one shard, world 6, drop: the 5 samples left out change every epoch and every
    sample is read within a few epochs; with 2 workers and batch 1 no epoch repeats the last one's order
    (layout 2 repeated one order and dropped the same 5 samples forever)."""
    config = PlanConfig(6, 2, seed=497265, remainder="drop", batch_size=1)
    orders, dropped = [], []
    for epoch in range(10):
        sequence = epoch_samples([17], config, (), epoch)
        order = [
            yield_order(plan_windows(sequence, config, epoch=epoch, rank=rank, worker_index=worker))
            for rank in range(6)
            for worker in range(2)
        ]
        read = {sample for part in order for _, sample, _ in part}
        orders.append(order)
        dropped.append(set(range(17)) - read)
    assert all(len(d) == 5 for d in dropped)
    assert all(a != b for a, b in itertools.pairwise(dropped))
    assert set().union(*(set(range(17)) - d for d in dropped)) == set(range(17))
    assert all(a != b for a, b in itertools.pairwise(orders))
