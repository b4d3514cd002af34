"""Elastic resume, pure: the rest of an epoch after a save, re-planned on another world, checked against a
naive oracle that replays every worker's yield order sample by sample."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from loaders.planning.elastic import Segment, consumed_count, consumed_runs, remaining_runs
from loaders.planning.planner import (
    PlanConfig,
    Runs,
    batches_per_rank,
    epoch_runs,
    num_samples,
    plan_windows,
    samples_per_rank,
    yield_order,
)

Sample = tuple[int, int]


def expand(runs: Runs) -> list[Sample]:
    return [(int(s), i) for s, a, b in runs.tolist() for i in range(a, b)]


def yields(runs: Runs, config: PlanConfig, epoch: int) -> dict[tuple[int, int], list[tuple[int, int, bool]]]:
    return {
        (rank, worker): yield_order(plan_windows(runs, config, epoch=epoch, rank=rank, worker_index=worker))
        for rank in range(config.world_size)
        for worker in range(config.num_readers)
    }


def oracle_consumed(runs: Runs, config: PlanConfig, epoch: int, batches: int) -> list[Sample]:
    """Replay the DataLoader: batch j of a rank comes from worker j % workers, whole batches per worker."""
    out = []
    for (_, worker), samples in yields(runs, config, epoch).items():
        batches_of_worker = [
            samples[i : i + config.batch_size] for i in range(0, len(samples), config.batch_size)
        ]
        own = len(range(worker, batches, config.num_readers))
        out += [(s, i) for batch in batches_of_worker[:own] for s, i, pad in batch if not pad]
    return out


def check_resume(sizes: list[int], history: list[Segment], final: PlanConfig, epoch: int) -> None:
    """Consumed before + everything after = each sample once, plus pads or minus drops; equal steps."""
    runs = epoch_runs(sizes, history[0].config, epoch)
    consumed: list[Sample] = []
    for segment in history:
        taken = oracle_consumed(runs, segment.config, epoch, segment.batches)
        assert sorted(expand(consumed_runs(runs, segment, epoch))) == sorted(taken)
        left = [x for x in expand(runs) if x not in set(taken)]
        runs = remaining_runs(sizes, history[: history.index(segment) + 1], epoch)
        assert expand(runs) == left  # the rest, in the epoch's order
        consumed += taken
    after = yields(runs, final, epoch)
    per_rank = samples_per_rank(num_samples(runs), final.world_size, final.remainder)
    for rank in range(final.world_size):
        assert sum(len(after[rank, w]) for w in range(final.num_readers)) == per_rank
    real = Counter(consumed + [(s, i) for samples in after.values() for s, i, pad in samples if not pad])
    universe = {(shard, i) for shard, size in enumerate(sizes) for i in range(size)}
    assert all(n == 1 for n in real.values()) and set(real) <= universe
    missing = len(universe) - len(real)
    if final.remainder == "pad":
        assert missing == 0
    else:
        assert missing == num_samples(runs) - final.world_size * per_rank


SIZES = [[7, 0, 12, 3, 9], [1], [40], [5, 5, 5, 5, 5, 5, 5]]
WORLDS = [(1, 0), (2, 2), (3, 1), (4, 2)]


@pytest.mark.parametrize("sizes", SIZES, ids=str)
def test_exhaustive_small_resizes(sizes: list[int]) -> None:
    for (w1, n1), (w2, n2), shuffle in itertools.product(WORLDS, WORLDS, (True, False)):
        old = PlanConfig(w1, n1, seed=3, shuffle=shuffle, batch_size=3, block_size=2, shuffle_buffer=5)
        new = PlanConfig(w2, n2, seed=3, shuffle=shuffle, batch_size=2, block_size=4, shuffle_buffer=7,
                         remainder="drop" if w2 == 3 else "pad")  # fmt: skip
        total = batches_per_rank(sum(sizes), old)
        for batches in sorted({0, 1, total // 2, max(total - 1, 0), total}):
            check_resume(sizes, [Segment(old, batches)], new, epoch=1)


def test_resized_twice_in_one_epoch() -> None:
    sizes = [11, 4, 20, 9]
    first = PlanConfig(2, 2, seed=5, batch_size=2, shuffle_buffer=6)
    second = PlanConfig(3, 0, seed=5, batch_size=3, shuffle_buffer=4)
    final = PlanConfig(1, 2, seed=5, batch_size=4)
    check_resume(sizes, [Segment(first, 3), Segment(second, 2)], final, epoch=2)


def test_layout_one_states_resume_exactly() -> None:
    """A state saved by the earlier layout is replayed with that layout's plan."""
    sizes = [13, 8, 21]
    old = PlanConfig(2, 2, seed=1, batch_size=3, block_size=256, layout=1)
    check_resume(sizes, [Segment(old, 2)], PlanConfig(3, 1, seed=1, batch_size=2), epoch=0)


def test_consumed_count_follows_round_robin() -> None:
    config = PlanConfig(1, 3, batch_size=4)
    per_rank = 30  # 8 batches of 4 (the last holds 2): workers hold 3, 3 and 2 batches = 12, 12, 6 samples
    assert [consumed_count(config, per_rank, w, 0) for w in range(3)] == [0, 0, 0]
    assert [consumed_count(config, per_rank, w, 4) for w in range(3)] == [8, 4, 4]
    assert [consumed_count(config, per_rank, w, 8) for w in range(3)] == [12, 12, 6]  # capped at the part


def test_large_sequence_is_fast_enough_to_plan() -> None:
    """The consumed set comes from array arithmetic, not per sample: 2 M samples, 8 ranks x 4 workers."""
    sizes = [50_000] * 40
    config = PlanConfig(8, 4, seed=0, batch_size=64)
    runs = remaining_runs(sizes, [Segment(config, 100)], epoch=0)
    assert num_samples(runs) == sum(sizes) - 8 * 100 * 64
    assert math.isclose(len(np.unique(runs[:, 0])), 40)


def test_segment_validation() -> None:
    with pytest.raises(ValueError, match="batches must be an int >= 0, got -1"):
        Segment(PlanConfig(1, 0), -1)
    with pytest.raises(ValueError, match="at least one segment"):
        remaining_runs([3], [], epoch=0)
