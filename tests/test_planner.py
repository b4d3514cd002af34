"""Planner guarantees, checked exhaustively in one process by looping over every rank and worker.

One oracle per guarantee: equal steps, exactly once (plus pads / minus drops), agreement with a naive
reference built sample by sample, determinism, locality and mixing.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from loaders.planning.permutation import permute
from loaders.planning.plan import plan_epoch, plan_windows
from loaders.planning.planner import (
    PlanConfig,
    Remainder,
    Span,
    batches_per_rank,
    epoch_runs,
    samples_per_rank,
    sequence_offset,
    shard_order,
    split_rows,
    worker_sample_counts,
    yield_order,
)
from loaders.planning.stream import RunsSequence, ShardSequence

Sample = tuple[int, int, bool]  # (shard_index, position inside the shard, is_pad)
Yields = dict[tuple[int, int], list[Sample]]  # (rank, worker) -> samples in yield order


def all_yields(sizes: list[int], config: PlanConfig, epoch: int = 0) -> Yields:
    runs = epoch_runs(sizes, config, epoch)
    return {
        (rank, worker): yield_order(plan_windows(runs, config, epoch=epoch, rank=rank, worker_index=worker))
        for rank in range(config.world_size)
        for worker in range(config.num_readers)
    }


def expected_per_rank(sizes: list[int], config: PlanConfig) -> int:
    """Computed here, not by the planner, so a wrong samples_per_rank cannot agree with itself."""
    total, world = sum(sizes), config.world_size
    return math.ceil(total / world) if config.remainder == "pad" else total // world


def check_equal_steps(sizes: list[int], config: PlanConfig, yields: Yields) -> None:
    """Guarantee 1: same per-rank total and per-worker counts on every rank, hence the same batch count."""
    per_rank = expected_per_rank(sizes, config)
    counts = worker_sample_counts(per_rank, config.num_workers, config.batch_size)
    assert len(counts) == config.num_readers and sum(counts) == per_rank
    for (_, worker), samples in yields.items():
        assert len(samples) == counts[worker]
    expected_batches = math.ceil(per_rank / config.batch_size)
    assert sum(math.ceil(n / config.batch_size) for n in counts) == expected_batches
    assert batches_per_rank(sum(sizes), config) == expected_batches


def check_exactly_once(sizes: list[int], config: PlanConfig, yields: Yields) -> None:
    """Guarantee 2: each sample once among real samples; pads are flagged duplicates, drops are counted."""
    total, world = sum(sizes), config.world_size
    per_rank = expected_per_rank(sizes, config)
    real = Counter((s, i) for samples in yields.values() for s, i, pad in samples if not pad)
    pads = [(s, i) for samples in yields.values() for s, i, pad in samples if pad]
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


def reference_shares(sizes: list[int], config: PlanConfig, epoch: int) -> dict[int, list[Sample]]:
    """Naive plan, sample by sample: the global sequence written out, wrapped, then cut per rank."""
    order = shard_order(len(sizes), config, epoch)
    flat = [(shard, i) for shard in order for i in range(sizes[shard])]
    total = len(flat)
    if config.layout >= 3:  # the epoch's rotation
        offset = sequence_offset(total, config, epoch)
        flat = flat[offset:] + flat[:offset]
    per_rank = samples_per_rank(total, config.world_size, config.remainder)
    begins = range(0, config.world_size * per_rank, per_rank or 1)
    return (
        {
            rank: [(*flat[p % total], p >= total) for p in range(begin, begin + per_rank)]
            for rank, begin in enumerate(begins)
        }
        if per_rank
        else {rank: [] for rank in range(config.world_size)}
    )


def check_matches_reference(sizes: list[int], config: PlanConfig, yields: Yields, epoch: int) -> None:
    """Each rank reads exactly its slice of the wrapped global sequence; unshuffled, in order by worker."""
    shares = reference_shares(sizes, config, epoch)
    for rank, share in shares.items():
        got = [x for worker in range(config.num_readers) for x in yields[rank, worker]]
        assert (sorted(got) == sorted(share)) if config.shuffle else (got == share)


def check_windows(sizes: list[int], config: PlanConfig, epoch: int) -> None:
    """Memory bound and locality: windows of shuffle_buffer samples made of spans inside one block."""
    runs = epoch_runs(sizes, config, epoch)
    bs = config.block_size
    for rank in range(config.world_size):
        for worker in range(config.num_readers):
            windows = plan_windows(runs, config, epoch=epoch, rank=rank, worker_index=worker)
            assert all(len(w) == config.shuffle_buffer for w in windows[:-1])
            assert all(0 < len(w) <= config.shuffle_buffer for w in windows)
            spans = [s for w in windows for s in w.spans]
            assert all(0 <= s.start < s.stop <= sizes[s.shard_index] for s in spans)
            if config.shuffle and config.layout < 3:
                assert all(s.start // bs == (s.stop - 1) // bs for s in spans)  # each span in one block
            for w in windows:  # a block is one read, or one a shard it crosses into
                shards = len({s.shard_index for s in w.spans})
                assert len(w.spans) <= (-(-len(w) // bs) + 1 if config.shuffle else 1) + 2 * shards


def check_all(sizes: list[int], config: PlanConfig, epoch: int = 0) -> None:
    yields = all_yields(sizes, config, epoch)
    check_equal_steps(sizes, config, yields)
    check_exactly_once(sizes, config, yields)
    check_matches_reference(sizes, config, yields, epoch)
    check_windows(sizes, config, epoch)


def _shard_lists() -> list[list[int]]:
    rng = np.random.default_rng(1234)
    fixed = [[], [0], [0, 0, 0], [1], [7], [100], [3, 0, 5], [1, 1], [0, 2, 0, 0, 1], [5, 5, 5, 5, 5, 5]]
    randoms = [rng.integers(0, 30, size=int(rng.integers(1, 12))).tolist() for _ in range(12)]
    sparse = [(rng.integers(0, 40, size=6) * (rng.random(6) < 0.5)).tolist() for _ in range(4)]
    return fixed + randoms + sparse


SHARD_LISTS = _shard_lists()


@pytest.mark.parametrize(
    "sizes",
    [pytest.param(s, marks=pytest.mark.slow) if sum(s) > 40 else s for s in SHARD_LISTS],
    ids=lambda s: f"n{len(s)}-N{sum(s)}",
)
def test_exhaustive_grid(sizes: list[int]) -> None:
    """World 1..8 x workers 0..4 x batch 1/3/8 x pad/drop x layouts 2 and 3, every rank and worker (layout 1
    only resumes old states: tests/test_elastic.py)."""
    remainders: tuple[Remainder, ...] = ("pad", "drop")
    grid = itertools.product(range(1, 9), range(5), (1, 3, 8), remainders, (2, 3))
    for world, workers, batch, remainder, layout in grid:
        config = PlanConfig(world, workers, seed=7, remainder=remainder, batch_size=batch, block_size=4,
                            shuffle_buffer=5, layout=layout)  # fmt: skip
        check_all(sizes, config, epoch=world % 2)
    for world, workers in itertools.product(range(1, 9), range(5)):
        check_all(sizes, PlanConfig(world, workers, shuffle=False, batch_size=3, shuffle_buffer=4))


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), max_size=12),
    world=st.integers(1, 8),
    workers=st.integers(0, 4),
    batch=st.sampled_from([1, 3, 8]),
    remainder=st.sampled_from(["pad", "drop"]),
    shuffle=st.booleans(),
    block_size=st.sampled_from([1, 2, 5, 256]),
    shuffle_buffer=st.sampled_from([1, 3, 16, 1024]),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 10),
)
def test_random_configs(
    sizes: list[int], world: int, workers: int, batch: int, remainder: str, shuffle: bool,
    block_size: int, shuffle_buffer: int, seed: int, epoch: int,
) -> None:  # fmt: skip
    config = PlanConfig(world, workers, seed, shuffle, remainder, batch, block_size, shuffle_buffer)  # type: ignore[arg-type]
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
    pad = all_yields(sizes, PlanConfig(8, 2, remainder="pad"))
    assert [len(pad[r, 0]) + len(pad[r, 1]) for r in range(8)] == [1] * 8
    assert sum(p for samples in pad.values() for _, _, p in samples) == 5
    assert all(samples == [] for samples in all_yields(sizes, PlanConfig(8, 2, remainder="drop")).values())
    assert batches_per_rank(3, PlanConfig(8, 2, remainder="drop")) == 0


def test_all_shards_empty() -> None:
    for remainder in ("pad", "drop"):
        config = PlanConfig(3, 2, remainder=remainder)  # type: ignore[arg-type]
        assert all(samples == [] for samples in all_yields([0, 0], config).values())
        assert all(samples == [] for samples in all_yields([], config).values())
        assert batches_per_rank(0, config) == 0


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

    def rank_sets(epoch: int) -> list[set[tuple[int, int, bool]]]:
        yields = all_yields(sizes, config, epoch)
        return [set(yields[r, 0] + yields[r, 1]) for r in range(4)]

    sets = [rank_sets(e) for e in range(4)]
    assert all(sets[a] != sets[b] for a, b in itertools.combinations(range(4), 2))
    assert len({tuple(shard_order(20, config, e)) for e in range(4)}) == 4
    other_seed = PlanConfig(4, 2, seed=4)
    assert shard_order(20, other_seed, 0) != shard_order(20, config, 0)


def test_no_shuffle_is_stored_order_every_epoch() -> None:
    config = PlanConfig(2, 1, shuffle=False)
    assert shard_order(5, config, 9) == [0, 1, 2, 3, 4]
    assert all_yields([3, 2], config, 0) == all_yields([3, 2], config, 5)
    assert plan_epoch([3, 2], config, epoch=0, rank=0, worker_index=0) == [Span(0, 0, 3)]


def test_shard_order_pinned() -> None:
    """The order must be the same on any machine; a numpy stream change would break resumed runs."""
    assert shard_order(8, PlanConfig(1, 0, seed=0), 0) == [2, 4, 3, 6, 5, 0, 1, 7]
    for layout, first_window in ((2, [(0, 8), (1, 0), (1, 8)]), (3, [(0, 8), (1, 0)])):
        config = PlanConfig(1, 0, seed=0, block_size=4, shuffle_buffer=8, layout=layout)
        windows = plan_windows(epoch_runs([10, 10], config, 0), config, epoch=0, rank=0, worker_index=0)
        assert [(s.shard_index, s.start) for s in windows[0].spans] == first_window
        assert yield_order(windows)[:6] == PINNED_FIRST_YIELDS
    assert permute(range(10), 10, (0,)).tolist() == [0, 5, 3, 7, 6, 1, 9, 8, 4, 2]
    assert permute([10**9, 5 * 10**9], 10**10, (1, 2)).tolist() == [5198380658, 7096012463]


PINNED_FIRST_YIELDS = [
    (1, 3, False),
    (1, 1, False),
    (0, 8, False),
    (0, 9, False),
    (1, 0, False),
    (1, 2, False),
]


def test_blocks_spread_each_worker_over_the_rank_share() -> None:
    """Layouts 2 and 3 permute blocks across the rank's whole share before the worker split: with two shards
    of 400 samples, each of two workers reads from both; layout 1 (contiguous worker parts) does not."""
    sizes = [400, 400]
    for layout, spread in ((3, True), (2, True), (1, False)):
        config = PlanConfig(1, 2, shuffle=True, block_size=4, layout=layout)
        yields = all_yields(sizes, config)
        shards = [{s for s, _, _ in yields[0, w]} for w in range(2)]
        assert (shards == [{0, 1}, {0, 1}]) == spread, layout


def test_small_blocks_mix_a_class_sorted_pack() -> None:
    """100 classes x 600 samples stored sorted by class, one rank, 2 workers, batch 64, defaults: a batch
    holds close to the classes a global permutation gives (ideal C(1-(1-1/C)^B))."""
    num_classes, per_class, batch = 100, 600, 64
    sizes = [num_classes * per_class]  # one shard, sorted by class: the hardest case
    config = PlanConfig(1, 2, seed=0, batch_size=batch)
    yields = all_yields(sizes, config)
    distinct = []
    for worker in range(2):
        labels = [i // per_class for _, i, _ in yields[0, worker]]
        distinct += [len(set(labels[j : j + batch])) for j in range(0, len(labels) - batch + 1, batch)]
    ideal = num_classes * (1 - (1 - 1 / num_classes) ** batch)
    assert np.mean(distinct) >= 0.9 * ideal
    old = PlanConfig(1, 2, seed=0, batch_size=batch, block_size=256)  # the earlier default
    labels = [i // per_class for _, i, _ in all_yields(sizes, old)[0, 0]]
    old_distinct = [len(set(labels[j : j + batch])) for j in range(0, len(labels) - batch, batch)]
    assert np.mean(old_distinct) < 0.2 * ideal


def test_locality_many_shards() -> None:
    """Reads stay local: with 100 shards over 4 ranks, each rank's workers touch about 1/4 of the shards."""
    sizes = [10] * 100
    yields = all_yields(sizes, PlanConfig(4, 2))
    for rank in range(4):
        assert len({s for w in range(2) for s, _, _ in yields[rank, w]}) <= 27, rank


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(0, 5), min_size=1, max_size=12), cuts=st.sets(st.integers(1, 59)))
def test_split_rows_cuts_the_stream_where_its_positions_would(lengths: list[int], cuts: set[int]) -> None:
    total = sum(lengths)
    assume(total > 0)
    starts = (np.cumsum([0, *lengths[:-1]]) * 2 + 1).tolist()
    rows = np.array([[i % 3, a, a + n, i % 2] for i, (a, n) in enumerate(zip(starts, lengths, strict=True))])
    bounds = [0, *sorted(c for c in cuts if c < total), total]

    def positions(cut: np.ndarray) -> list[tuple[int, int, int]]:
        return [(s, i, pad) for s, a, z, pad in cut.tolist() for i in range(a, z)]

    stream = positions(rows)
    pieces = split_rows(rows, bounds)
    assert [positions(p) for p in pieces] == [stream[a:z] for a, z in itertools.pairwise(bounds)]


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
        ({"world_size": 2, "num_workers": 1, "shuffle_buffer": 0}, "shuffle_buffer must be >= 1, got 0"),
        ({"world_size": 2, "num_workers": 1, "layout": 4}, r"layout must be one of \(1, 2, 3\), got 4"),
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


@pytest.mark.parametrize("sizes", SHARD_LISTS[:16], ids=lambda s: f"n{len(s)}-N{sum(s)}")
def test_the_epochs_sequence_without_its_runs_is_the_same_sequence(sizes: list[int]) -> None:
    """Layout 3 keeps a fresh epoch as shard order and prefix sums (``ShardSequence``): position for
    position the sequence that ``epoch_runs`` writes out."""
    for seed, shuffle, epoch in ((0, True, 0), (7, True, 3), (1, False, 2)):
        config = PlanConfig(2, 1, seed=seed, shuffle=shuffle)
        lazy, written = ShardSequence(sizes, config, epoch), RunsSequence(epoch_runs(sizes, config, epoch))
        assert lazy.size == written.size == sum(sizes)
        positions = np.arange(lazy.size)
        for got, expected in zip(lazy.take(positions), written.take(positions), strict=True):
            assert np.array_equal(got, expected)
