"""Elastic resume, pure: the rest of an epoch after a save, re-planned on another world, checked against a
naive oracle that replays every worker's yield order sample by sample."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from loaders.planning.elastic import Segment, consumed_count, consumed_runs, epoch_samples, remaining_runs
from loaders.planning.plan import plan_windows
from loaders.planning.planner import (
    PlanConfig,
    Runs,
    batches_per_rank,
    samples_per_rank,
    yield_order,
)
from loaders.planning.stream import Samples

Sample = tuple[int, int]
Yield = tuple[int, int, bool]


def expand(runs: Runs) -> list[Sample]:
    return [(int(s), i) for s, a, b in runs.tolist() for i in range(a, b)]


def yields(
    runs: Samples, config: PlanConfig, epoch: int
) -> dict[tuple[int, int], list[tuple[int, int, bool]]]:
    return {
        (rank, worker): yield_order(plan_windows(runs, config, epoch=epoch, rank=rank, worker_index=worker))
        for rank in range(config.world_size)
        for worker in range(config.num_readers)
    }


def oracle_consumed(runs: Samples, config: PlanConfig, epoch: int, batches: int) -> list[Sample]:
    """Replay the DataLoader: batch j of a rank comes from worker j % workers, whole batches per worker."""
    out = []
    for (_, worker), samples in yields(runs, config, epoch).items():
        batches_of_worker = [
            samples[i : i + config.batch_size] for i in range(0, len(samples), config.batch_size)
        ]
        own = len(range(worker, batches, config.num_readers))
        out += [(s, i) for batch in batches_of_worker[:own] for s, i, pad in batch if not pad]
    return out


def expand_sequence(sequence: Samples) -> list[Sample]:
    shard, sample = sequence.take(np.arange(sequence.size))
    return list(zip(shard.tolist(), sample.tolist(), strict=True))


def check_resume(sizes: list[int], history: list[Segment], final: PlanConfig, epoch: int) -> None:
    """Consumed before + everything after = each sample once, plus pads or minus drops; equal steps."""
    sequence = epoch_samples(sizes, history[0].config, (), epoch)
    consumed: list[Sample] = []
    for count, segment in enumerate(history, start=1):
        taken = oracle_consumed(sequence, segment.config, epoch, segment.batches)
        left = [x for x in expand_sequence(sequence) if x not in set(taken)]
        if segment.config.layout < 3:  # the consumed runs, and the rest in the epoch's order
            runs = sequence.runs  # type: ignore[attr-defined]
            assert sorted(expand(consumed_runs(runs, segment, epoch))) == sorted(taken)
            assert expand(remaining_runs(sizes, history[:count], epoch)) == left
        sequence = epoch_samples(sizes, history[0].config, history[:count], epoch)
        rest = expand_sequence(sequence)
        assert (rest == left) if segment.config.layout < 3 else (sorted(rest) == sorted(left))
        consumed += taken
    after = yields(sequence, final, epoch)
    per_rank = samples_per_rank(sequence.size, final.world_size, final.remainder)
    for rank in range(final.world_size):
        assert sum(len(after[rank, w]) for w in range(final.num_readers)) == per_rank
    real = Counter(consumed + [(s, i) for samples in after.values() for s, i, pad in samples if not pad])
    universe = {(shard, i) for shard, size in enumerate(sizes) for i in range(size)}
    assert all(n == 1 for n in real.values()) and set(real) <= universe
    missing = len(universe) - len(real)
    if final.remainder == "pad":
        assert missing == 0
    else:
        assert missing == sequence.size - final.world_size * per_rank


SIZES = [[7, 0, 12, 3, 9], [1], [40], [5, 5, 5, 5, 5, 5, 5]]
WORLDS = [(1, 0), (2, 2), (3, 1), (4, 2)]


@pytest.mark.parametrize("sizes", SIZES, ids=str)
def test_exhaustive_small_resizes(sizes: list[int]) -> None:
    grid = itertools.product(WORLDS, WORLDS, (True, False), (2, 3))
    for (w1, n1), (w2, n2), shuffle, layout in grid:
        old = PlanConfig(w1, n1, seed=3, shuffle=shuffle, batch_size=3, block_size=2, shuffle_buffer=5,
                         layout=layout)  # fmt: skip
        new = PlanConfig(w2, n2, seed=3, shuffle=shuffle, batch_size=2, block_size=4, shuffle_buffer=7,
                         remainder="drop" if w2 == 3 else "pad")  # fmt: skip
        total = batches_per_rank(sum(sizes), old)
        for batches in sorted({0, 1, total // 2, max(total - 1, 0), total}):
            check_resume(sizes, [Segment(old, batches)], new, epoch=1)


def test_resized_twice_in_one_epoch() -> None:
    sizes = [11, 4, 20, 9]
    for layout in (2, 3):
        first = PlanConfig(2, 2, seed=5, batch_size=2, shuffle_buffer=6, layout=layout)
        second = PlanConfig(3, 0, seed=5, batch_size=3, shuffle_buffer=4, layout=layout)
        final = PlanConfig(1, 2, seed=5, batch_size=4)
        check_resume(sizes, [Segment(first, 3), Segment(second, 2)], final, epoch=2)


def test_an_old_layout_then_the_new_one() -> None:
    """A layout-2 state resumed on another world, saved again (layout 3), resumed once more."""
    sizes = [11, 4, 20, 9]
    first = PlanConfig(2, 2, seed=5, batch_size=2, shuffle_buffer=6, layout=2)
    second = PlanConfig(3, 0, seed=5, batch_size=3, shuffle_buffer=4)
    check_resume(sizes, [Segment(first, 3), Segment(second, 2)], PlanConfig(1, 2, seed=5), epoch=2)


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
    """The consumed set comes from array arithmetic, not per sample: 2 M samples, 8 ranks x 4 workers;
    layout 3 finds the rest's positions on demand."""
    sizes = [50_000] * 40
    for layout in (2, 3):
        config = PlanConfig(8, 4, seed=0, batch_size=64, layout=layout)
        rest = epoch_samples(sizes, config, [Segment(config, 100)], epoch=0)
        assert rest.size == sum(sizes) - 8 * 100 * 64
        shard, _ = rest.take(np.arange(0, rest.size, 997))
        assert math.isclose(len(np.unique(shard)), 40)


def test_segment_validation() -> None:
    with pytest.raises(ValueError, match="batches must be an int >= 0, got -1"):
        Segment(PlanConfig(1, 0), -1)
    with pytest.raises(ValueError, match="at least one segment"):
        remaining_runs([3], [], epoch=0)
