"""Planner guarantees, checked exhaustively in one process by looping over every rank and worker.

One oracle per guarantee: equal steps, exactly once (plus pads / minus drops), agreement with a naive
reference built sample by sample, determinism, and locality.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.planner import (
    PlanConfig,
    Remainder,
    Span,
    batches_per_rank,
    plan_epoch,
    samples_per_rank,
    shard_order,
    worker_sample_counts,
)

Plans = dict[tuple[int, int], list[Span]]
Sample = tuple[int, int]  # (shard_index, position inside the shard)
Reference = dict[tuple[int, int], list[tuple[int, int, bool]]]  # (rank, worker) -> (shard, position, is_pad)


def all_plans(sizes: list[int], config: PlanConfig, epoch: int = 0) -> Plans:
    return {
        (rank, worker): plan_epoch(sizes, config, epoch=epoch, rank=rank, worker_index=worker)
        for rank in range(config.world_size)
        for worker in range(config.num_readers)
    }


def samples_of(spans: list[Span], *, pad: bool | None = None) -> list[Sample]:
    return [
        (s.shard_index, i) for s in spans if pad is None or s.is_pad == pad for i in range(s.start, s.stop)
    ]


def expected_per_rank(sizes: list[int], config: PlanConfig) -> int:
    """Computed here, not by the planner, so a wrong samples_per_rank cannot agree with itself."""
    total, world = sum(sizes), config.world_size
    return math.ceil(total / world) if config.remainder == "pad" else total // world


def check_equal_steps(sizes: list[int], config: PlanConfig, plans: Plans) -> None:
    """Guarantee 1: same per-rank total and per-worker counts on every rank, hence the same batch count."""
    per_rank = expected_per_rank(sizes, config)
    counts = worker_sample_counts(per_rank, config.num_workers, config.batch_size)
    assert len(counts) == config.num_readers and sum(counts) == per_rank
    for (_, worker), spans in plans.items():
        assert sum(len(s) for s in spans) == counts[worker]
    expected_batches = math.ceil(per_rank / config.batch_size)
    assert sum(math.ceil(n / config.batch_size) for n in counts) == expected_batches
    assert batches_per_rank(sizes, config) == expected_batches


def check_exactly_once(sizes: list[int], config: PlanConfig, plans: Plans) -> None:
    """Guarantee 2: each sample once among real spans; pads are flagged duplicates, drops are counted."""
    total, world = sum(sizes), config.world_size
    per_rank = expected_per_rank(sizes, config)
    real = Counter(x for spans in plans.values() for x in samples_of(spans, pad=False))
    pads = [x for spans in plans.values() for x in samples_of(spans, pad=True)]
    universe = {(shard, i) for shard, size in enumerate(sizes) for i in range(size)}
    assert all(n == 1 for n in real.values())
    assert set(real) <= universe
    if config.remainder == "pad":
        assert set(real) == universe
        assert len(pads) == world * per_rank - total
        assert set(pads) <= universe
    else:
        assert pads == []
        assert len(universe - set(real)) == total - world * per_rank


def reference_slices(sizes: list[int], config: PlanConfig, epoch: int) -> Reference:
    """Naive plan, sample by sample: the global sequence written out, wrapped, then sliced."""
    order = shard_order(len(sizes), config, epoch)
    flat = [(shard, i) for shard in order for i in range(sizes[shard])]
    total = len(flat)
    per_rank = samples_per_rank(total, config.world_size, config.remainder)
    counts = worker_sample_counts(per_rank, config.num_workers, config.batch_size)
    out: Reference = {}
    for rank in range(config.world_size):
        begin = rank * per_rank
        for worker, n in enumerate(counts):
            out[rank, worker] = [(*flat[p % total], p >= total) for p in range(begin, begin + n)]
            begin += n
    return out


def check_matches_reference(sizes: list[int], config: PlanConfig, plans: Plans, epoch: int) -> None:
    """Each worker reads exactly its slice of the wrapped global sequence (in order when unshuffled)."""
    reference = reference_slices(sizes, config, epoch)
    for key, spans in plans.items():
        got = [(s.shard_index, i, s.is_pad) for s in spans for i in range(s.start, s.stop)]
        if config.shuffle:
            assert sorted(got) == sorted(reference[key])
        else:
            assert got == reference[key]


def check_locality(sizes: list[int], config: PlanConfig, plans: Plans) -> None:
    """Guarantee 5: few contiguous spans per worker: one per shard touched (+1 for the wrap), plus blocks."""
    for spans in plans.values():
        assert all(0 <= s.start < s.stop <= sizes[s.shard_index] for s in spans)
        shards_touched = len({s.shard_index for s in spans})
        if not config.shuffle:
            assert len(spans) <= shards_touched + 1
            continue
        bs = config.block_size
        assert all(s.start // bs == (s.stop - 1) // bs for s in spans)  # each piece inside one block
        blocks_touched = len({(s.shard_index, s.start // bs) for s in spans})
        assert len(spans) <= blocks_touched + 1
        n = sum(len(s) for s in spans)
        assert len(spans) <= math.ceil(n / bs) + 2 * (shards_touched + 1)


def check_all(sizes: list[int], config: PlanConfig, epoch: int = 0) -> None:
    plans = all_plans(sizes, config, epoch)
    check_equal_steps(sizes, config, plans)
    check_exactly_once(sizes, config, plans)
    check_matches_reference(sizes, config, plans, epoch)
    check_locality(sizes, config, plans)


def _shard_lists() -> list[list[int]]:
    rng = np.random.default_rng(1234)
    fixed = [[], [0], [0, 0, 0], [1], [7], [100], [3, 0, 5], [1, 1], [0, 2, 0, 0, 1], [5, 5, 5, 5, 5, 5]]
    randoms = [rng.integers(0, 30, size=int(rng.integers(1, 12))).tolist() for _ in range(12)]
    sparse = [(rng.integers(0, 40, size=6) * (rng.random(6) < 0.5)).tolist() for _ in range(4)]
    return fixed + randoms + sparse


SHARD_LISTS = _shard_lists()


@pytest.mark.parametrize("sizes", SHARD_LISTS, ids=lambda s: f"n{len(s)}-N{sum(s)}")
def test_exhaustive_grid(sizes: list[int]) -> None:
    """World 1..8 x workers 0..4 x batch 1/3/8 x pad/drop, every rank and worker, two epochs."""
    remainders: tuple[Remainder, ...] = ("pad", "drop")
    for world, workers, batch, remainder in itertools.product(range(1, 9), range(5), (1, 3, 8), remainders):
        config = PlanConfig(world, workers, seed=7, remainder=remainder, batch_size=batch, block_size=4)
        check_all(sizes, config, epoch=world % 2)
    for world, workers in itertools.product(range(1, 9), range(5)):
        check_all(sizes, PlanConfig(world, workers, shuffle=False, batch_size=3))


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), max_size=12),
    world=st.integers(1, 8),
    workers=st.integers(0, 4),
    batch=st.sampled_from([1, 3, 8]),
    remainder=st.sampled_from(["pad", "drop"]),
    shuffle=st.booleans(),
    block_size=st.sampled_from([1, 2, 5, 256]),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 10),
)
def test_random_configs(
    sizes: list[int], world: int, workers: int, batch: int, remainder: str, shuffle: bool,
    block_size: int, seed: int, epoch: int,
) -> None:  # fmt: skip
    config = PlanConfig(world, workers, seed, shuffle, remainder, batch, block_size)  # type: ignore[arg-type]
    check_all(sizes, config, epoch)


def test_worker_sample_counts_whole_batches() -> None:
    assert worker_sample_counts(10, 4, 3) == [3, 3, 3, 1]
    assert worker_sample_counts(10, 2, 3) == [6, 4]
    assert worker_sample_counts(7, 4, 3) == [3, 3, 1, 0]
    assert worker_sample_counts(1, 4, 8) == [1, 0, 0, 0]
    assert worker_sample_counts(0, 3, 2) == [0, 0, 0]
    assert worker_sample_counts(5, 0, 2) == [5]
    for per_rank, workers, batch in itertools.product(range(40), range(6), (1, 2, 3, 8)):
        counts = worker_sample_counts(per_rank, workers, batch)
        nonempty = [i for i, n in enumerate(counts) if n]
        assert sum(counts) == per_rank
        assert all(counts[i] % batch == 0 for i in nonempty[:-1])  # only the last non-empty is partial
        assert sum(math.ceil(n / batch) for n in counts) == math.ceil(per_rank / batch)


def test_samples_per_rank() -> None:
    assert samples_per_rank(10, 4, "pad") == 3
    assert samples_per_rank(10, 4, "drop") == 2
    assert samples_per_rank(3, 8, "pad") == 1
    assert samples_per_rank(3, 8, "drop") == 0
    assert samples_per_rank(0, 8, "pad") == 0


def test_fewer_samples_than_ranks() -> None:
    sizes = [2, 0, 1]
    pad = all_plans(sizes, PlanConfig(8, 2, remainder="pad"))
    assert [sum(len(s) for s in pad[r, 0]) + sum(len(s) for s in pad[r, 1]) for r in range(8)] == [1] * 8
    assert sum(s.is_pad for spans in pad.values() for s in spans) == 5
    assert all(spans == [] for spans in all_plans(sizes, PlanConfig(8, 2, remainder="drop")).values())
    assert batches_per_rank(sizes, PlanConfig(8, 2, remainder="drop")) == 0


def test_all_shards_empty() -> None:
    for remainder in ("pad", "drop"):
        config = PlanConfig(3, 2, remainder=remainder)
        assert all(spans == [] for spans in all_plans([0, 0], config).values())
        assert all(spans == [] for spans in all_plans([], config).values())
        assert batches_per_rank([0, 0], config) == 0


def test_same_inputs_same_plan_any_call_order() -> None:
    sizes = [13, 0, 7, 22, 5, 9, 1]
    config = PlanConfig(3, 2, seed=11, batch_size=3, block_size=4)
    keys = [(e, r, w) for e in range(3) for r in range(3) for w in range(2)]
    forward = {k: plan_epoch(sizes, config, epoch=k[0], rank=k[1], worker_index=k[2]) for k in keys}
    backward = {
        k: plan_epoch(sizes, config, epoch=k[0], rank=k[1], worker_index=k[2]) for k in reversed(keys)
    }
    assert forward == backward
    assert plan_epoch(list(np.array(sizes)), config, epoch=1, rank=2, worker_index=1) == forward[1, 2, 1]


def test_different_epoch_different_order() -> None:
    """The forgotten set_epoch bug: a new epoch must change which samples each rank sees, not just order."""
    sizes = [int(n) for n in np.random.default_rng(5).integers(1, 50, size=20)]
    config = PlanConfig(4, 2, seed=3)

    def rank_sets(epoch: int) -> list[set[Sample]]:
        plans = all_plans(sizes, config, epoch)
        return [set(samples_of(plans[r, 0] + plans[r, 1])) for r in range(4)]

    sets = [rank_sets(e) for e in range(4)]
    assert all(sets[a] != sets[b] for a, b in itertools.combinations(range(4), 2))
    assert len({tuple(shard_order(20, config, e)) for e in range(4)}) == 4
    other_seed = PlanConfig(4, 2, seed=4)
    assert shard_order(20, other_seed, 0) != shard_order(20, config, 0)


def test_no_shuffle_is_stored_order_every_epoch() -> None:
    config = PlanConfig(2, 1, shuffle=False)
    assert shard_order(5, config, 9) == [0, 1, 2, 3, 4]
    assert all_plans([3, 2], config, 0) == all_plans([3, 2], config, 5)
    assert all_plans([3, 2], config, 0)[0, 0] == [Span(0, 0, 3)]


def test_shard_order_pinned() -> None:
    """The order must be the same on any machine; a numpy stream change would break resumed runs."""
    assert shard_order(8, PlanConfig(1, 0, seed=0), 0) == shard_order(8, PlanConfig(1, 0, seed=0), 0)
    assert shard_order(8, PlanConfig(1, 0, seed=0), 0) == [2, 4, 3, 6, 5, 0, 1, 7]


def test_block_split_spreads_reads() -> None:
    """Small blocks: the shuffle permutes block-sized contiguous pieces; a huge block keeps spans whole."""
    sizes = [40, 40]
    whole = plan_epoch(sizes, PlanConfig(1, 0, block_size=1000), epoch=0, rank=0, worker_index=0)
    small = plan_epoch(sizes, PlanConfig(1, 0, block_size=8), epoch=0, rank=0, worker_index=0)
    assert len(whole) == 2
    assert len(small) == 10 and all(len(s) == 8 and s.start % 8 == 0 for s in small)
    assert sorted(samples_of(small)) == sorted(samples_of(whole))
    assert small != sorted(small, key=lambda s: (s.shard_index, s.start))


def test_locality_many_shards() -> None:
    """Reads stay local: with 100 shards over 8 readers, each reader touches about 1/8 of the shards."""
    sizes = [10] * 100
    for (rank, worker), spans in all_plans(sizes, PlanConfig(4, 2, block_size=1000)).items():
        assert len({s.shard_index for s in spans}) <= 14, (rank, worker)


def test_span_len() -> None:
    assert len(Span(3, 4, 9)) == 5
    assert len(Span(0, 2, 2, is_pad=True)) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 0, "num_workers": 1}, "world_size must be >= 1, got 0"),
        ({"world_size": 2, "num_workers": -1}, "num_workers must be >= 0, got -1"),
        ({"world_size": 2, "num_workers": 1, "seed": -3}, "seed must be >= 0, got -3"),
        ({"world_size": 2, "num_workers": 1, "batch_size": 0}, "batch_size must be >= 1, got 0"),
        ({"world_size": 2, "num_workers": 1, "block_size": 0}, "block_size must be >= 1, got 0"),
        ({"world_size": 2, "num_workers": 1, "remainder": "wrap"}, "'pad' or 'drop', got 'wrap'"),
    ],
)
def test_config_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlanConfig(**kwargs)  # type: ignore[arg-type]


def test_config_rejects_non_int_and_is_frozen() -> None:
    with pytest.raises(TypeError, match=r"world_size must be an int, got 2\.0"):
        PlanConfig(2.0, 1)  # type: ignore[arg-type]
    config = PlanConfig(2, 1)
    with pytest.raises(AttributeError):
        config.seed = 5  # type: ignore[misc]


def test_plan_argument_validation() -> None:
    config = PlanConfig(2, 0)
    with pytest.raises(ValueError, match=r"rank must be \[0, 2\), got 2"):
        plan_epoch([4], config, epoch=0, rank=2, worker_index=0)
    with pytest.raises(ValueError, match=r"worker_index must be \[0, 1\), got 1"):
        plan_epoch([4], config, epoch=0, rank=0, worker_index=1)
    with pytest.raises(ValueError, match="epoch must be >= 0, got -1"):
        plan_epoch([4], config, epoch=-1, rank=0, worker_index=0)
    with pytest.raises(ValueError, match=r"shard_sizes\[1\] must be a non-negative int, got -2"):
        plan_epoch([4, -2], config, epoch=0, rank=0, worker_index=0)
