"""The mixture planner, pure, over random mixtures (1-5 sources, random weights and sizes, world 1-8,
workers 0-3, pad and drop): exact counts, the schedule's proved prefix bound, exactly once with equal
steps, worker-count independence, per-source passes, contiguous reads, per-batch composition, and
resume at a random point onto another world size."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.planning import EpochMix, Stages, epoch_mix, epoch_schedule, epoch_sequence, largest_remainder
from loaders.planning.balance import batch_counts
from loaders.planning.elastic import Segment, consumed_runs, rest_of
from loaders.planning.mixture import (
    MixtureSequence,
    SourceTable,
    cursor_runs,
    epoch_samples_of,
    first_cursors,
    quota_schedule,
    stride_schedule,
)
from loaders.planning.plan import plan_windows
from loaders.planning.planner import PlanConfig, samples_per_rank, worker_part, yield_order
from loaders.planning.stream import Samples

FAST = settings(max_examples=40, deadline=None)


@st.composite
def mixtures(draw: st.DrawFn, max_total: int = 120) -> tuple[list[float], list[int], int]:
    """(weights, source sizes, samples per epoch)."""
    k = draw(st.integers(1, 5))
    weights = draw(st.lists(st.floats(0.01, 10.0), min_size=k, max_size=k))
    sizes = draw(st.lists(st.integers(1, 40), min_size=k, max_size=k))
    return weights, sizes, draw(st.integers(1, max_total))


def mix_of(weights: list[float], total: int) -> EpochMix:
    names = [f"s{i}" for i in range(len(weights))]
    return epoch_mix(dict(zip(names, weights, strict=True)), names, [1] * len(names), total)


def deviations(mix: EpochMix, schedule: np.ndarray) -> np.ndarray:
    """``(N + 1, k)`` each prefix's count of each source minus its share."""
    counts, total = np.asarray(mix.counts), mix.num_samples
    prefix = np.cumsum(np.eye(len(counts), dtype=np.int64)[schedule], axis=0)
    prefix = np.vstack([np.zeros(len(counts), dtype=np.int64), prefix])
    shares: np.ndarray = np.arange(total + 1)[:, None] * counts[None, :] / total
    return np.asarray(prefix - shares, dtype=np.float64)


@FAST
@given(mixtures(), st.integers(0, 3))
def test_counts_are_exact_largest_remainder(mixture: tuple[list[float], list[int], int], epoch: int) -> None:
    weights, _, total = mixture
    mix = mix_of(weights, total)
    share = [w / math.fsum(weights) * total for w in weights]
    assert sum(mix.counts) == total
    assert all(abs(c - x) < 1 for c, x in zip(mix.counts, share, strict=True))
    assert np.bincount(epoch_schedule(mix, 7, epoch), minlength=len(weights)).tolist() == list(mix.counts)
    source, j = lazy_schedule(mix, 7, epoch)
    assert np.bincount(source, minlength=len(weights)).tolist() == list(mix.counts)
    for s in range(len(weights)):  # each source's epoch samples once, in order
        assert j[source == s].tolist() == list(range(mix.counts[s]))


def lazy_schedule(mix: EpochMix, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """Layout 3's schedule of the whole epoch, asked position by position in two ranges."""
    sequence = MixtureSequence(mix, seed, epoch)
    positions = np.arange(sequence.size)
    half = sequence.size // 2
    source, j = sequence.take(np.concatenate([positions[half:], positions[:half]]))
    order = np.argsort(np.concatenate([positions[half:], positions[:half]]))
    return source[order], j[order]


@FAST
@given(mixtures(max_total=400), st.integers(0, 3))
def test_every_prefix_within_one_and_every_interval_within_two(
    mixture: tuple[list[float], list[int], int], epoch: int
) -> None:
    weights, _, total = mixture
    mix = mix_of(weights, total)
    deviation = deviations(mix, epoch_schedule(mix, 7, epoch))
    assert np.abs(deviation).max() <= 1 + 1e-9
    assert (deviation.max(axis=0) - deviation.min(axis=0)).max() <= 2 + 1e-9  # any [a, b): two prefixes
    lazy = deviations(mix, lazy_schedule(mix, 7, epoch)[0])  # layout 3: within one up to 3 sources
    assert np.abs(lazy).max() <= (1 if len(weights) <= 3 else 1.68)


def test_a_skewed_mix_of_four_takes_the_quota_order() -> None:
    """The stride order alone is off by more than one here ((k - 2) * max w > 1); the quota order keeps
    floor(p * w) <= count <= ceil(p * w) for every prefix."""
    mix = mix_of([0.7, 0.1, 0.1, 0.1], 1000)
    ranks = np.arange(4)
    assert np.abs(deviations(mix, stride_schedule(list(mix.counts), ranks))).max() > 1
    quota = quota_schedule(list(mix.counts), [2, 0, 3, 1])
    deviation = deviations(mix, quota)
    assert np.all(deviation > -1) and np.all(deviation < 1)  # floor(p w) <= c_s(p) <= ceil(p w)
    assert np.abs(deviations(mix, epoch_schedule(mix, 0, 0))).max() < 1
    assert np.abs(deviations(mix, lazy_schedule(mix, 0, 0)[0])).max() < 1.68  # layout 3's proved bound


def all_yields(
    runs: Samples | np.ndarray, config: PlanConfig, epoch: int
) -> dict[tuple[int, int], list[tuple[int, int, bool]]]:
    return {
        (rank, worker): yield_order(plan_windows(runs, config, epoch=epoch, rank=rank, worker_index=worker))
        for rank in range(config.world_size)
        for worker in range(config.num_readers)
    }


def mixture_config(
    world: int, workers: int, remainder: str, batch: int, per_batch: bool = False
) -> PlanConfig:
    return PlanConfig(
        world_size=world,
        num_workers=workers,
        seed=3,
        remainder=remainder,  # type: ignore[arg-type]
        batch_size=batch,
        block_size=1,
        shuffle_buffer=batch if per_batch else 5,
        permute_blocks=False,
        balance_batches=per_batch,
    )


@FAST
@given(mixtures(), st.integers(1, 8), st.sampled_from(["pad", "drop"]), st.integers(1, 6), st.booleans())
def test_exactly_once_equal_steps_and_worker_independent(
    mixture: tuple[list[float], list[int], int], world: int, remainder: str, batch: int, per_batch: bool
) -> None:
    weights, _, total = mixture
    mix = mix_of(weights, total)
    per_rank = samples_per_rank(total, world, remainder)  # type: ignore[arg-type]
    multisets = []
    for workers, layout in itertools.product(range(4), (2, 3)):
        runs = epoch_samples_of(mix, 3, 1, layout)
        config = replace(mixture_config(world, workers, remainder, batch, per_batch), layout=layout)
        yields = all_yields(runs, config, 1)
        ranks = [sorted(x for w in range(config.num_readers) for x in yields[r, w]) for r in range(world)]
        assert all(len(r) == per_rank for r in ranks)  # equal steps follow from equal, batch-aligned counts
        real = Counter((s, j) for r in ranks for s, j, pad in r if not pad)
        assert all(n == 1 for n in real.values())
        expected = total if remainder == "pad" else world * per_rank
        assert len(real) == expected
        multisets.append(ranks)
    assert all(m == multisets[0] for m in multisets[0::2])  # the same per rank for 0..3 workers
    assert all(m == multisets[1] for m in multisets[1::2])


@FAST
@given(mixtures(), st.integers(1, 8), st.integers(0, 3), st.integers(1, 6))
def test_each_worker_part_reads_each_source_contiguously(
    mixture: tuple[list[float], list[int], int], world: int, workers: int, batch: int
) -> None:
    weights, _, total = mixture
    mix = mix_of(weights, total)
    runs = epoch_sequence(mix, 3, 0)
    config = mixture_config(world, workers, "drop", batch)
    for rank in range(world):
        for worker in range(config.num_readers):
            part = worker_part(runs, config, epoch=0, rank=rank, worker_index=worker)
            for s in range(len(mix.counts)):
                rows = part[part[:, 0] == s]
                assert np.all(rows[1:, 1] == rows[:-1, 2])  # one contiguous stretch of the source's j
            got = np.bincount(part[:, 0], weights=part[:, 2] - part[:, 1], minlength=len(mix.counts))
            ideal = (part[:, 2] - part[:, 1]).sum() * np.asarray(mix.counts) / total
            assert np.all(np.abs(got - ideal) <= 2 + 1e-9)  # a part is an interval


@FAST
@given(st.lists(st.integers(1, 30), min_size=1, max_size=5), st.integers(1, 9), st.booleans())
def test_per_source_passes_never_repeat_before_coverage(sizes: list[int], block: int, shuffle: bool) -> None:
    shards = [[n // 2, n - n // 2] for n in sizes]  # two shards per source, one may be empty
    for source, shard_sizes in enumerate(shards):
        size = sum(shard_sizes)
        for rows in (
            cursor_runs(shard_sizes, block, shuffle, 11, source, 0, 3 * size + 2),
            SourceTable.of([shard_sizes], [block], shuffle, 11).rows(0, 0, 3 * size + 2),  # layout 3
        ):
            samples = [(int(s), i) for s, a, b in rows.tolist() for i in range(a, b)]
            assert len(samples) == 3 * size + 2
            for p in range(3):  # each pass is a permutation of all the source's samples
                assert len(set(samples[p * size : (p + 1) * size])) == size
            if shuffle and size >= 3 * block:
                assert samples[:size] != samples[size : 2 * size]  # a new pass is reshuffled


def test_cursors_continue_across_epochs_with_changing_weights() -> None:
    names, sizes = ["a", "b"], [10, 4]
    mixes = [epoch_mix(w, names, sizes, None) for w in ({"a": 0.5, "b": 0.5}, {"a": 3, "b": 1})]
    assert mixes[0].counts == (7, 7) and mixes[1].counts == (3, 1)
    assert first_cursors(mixes, 2) == (10, 8)  # b ran two passes, a one


def test_stages_change_weights_at_a_global_index() -> None:
    names = ["a", "b"]
    mix = epoch_mix(Stages(((0, {"a": 1.0, "b": 0.0}), (6, {"a": 0.0, "b": 1.0}))), names, [5, 5], None)
    assert epoch_schedule(mix, 0, 0).tolist() == [0] * 6 + [1] * 4


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"a": 1.0}, "miss source"),
        ({"a": 1.0, "b": 1.0, "c": 1.0}, "unknown source"),
        ({"a": -1.0, "b": 1.0}, "finite and >= 0"),
        ({"a": float("nan"), "b": 1.0}, "finite and >= 0"),
        ({"a": float("inf"), "b": 1.0}, "finite and >= 0"),
        ({"a": 0.0, "b": 0.0}, "positive weight"),
    ],
)
def test_bad_weights_name_the_culprit(weights: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        epoch_mix(weights, ["a", "b"], [3, 3], None)


def test_largest_remainder_ties_to_the_earlier_source() -> None:
    assert largest_remainder([0.5, 0.5], 3) == (2, 1)


@FAST
@given(st.lists(st.integers(0, 20), min_size=1, max_size=5), st.integers(1, 8))
def test_per_batch_counts_within_one_of_the_share(totals: list[int], batch: int) -> None:
    length = sum(totals)
    if length == 0:
        return
    counts = batch_counts(totals, batch)
    assert [sum(column) for column in zip(*counts, strict=True)] == totals
    for m, row in enumerate(counts[:-1] if length % batch else counts):
        assert sum(row) == batch
        assert all(abs(n - batch * c / length) < 1 for n, c in zip(row, totals, strict=True)), (m, row)


def oracle_consumed(runs: Samples, config: PlanConfig, epoch: int, batches: int) -> list[tuple[int, int]]:
    """Replay the DataLoader: batch j of a rank comes from worker j % workers."""
    out = []
    for (_, worker), samples in all_yields(runs, config, epoch).items():
        own = len(range(worker, batches, config.num_readers))
        out += [(s, j) for s, j, pad in samples[: own * config.batch_size] if not pad]
    return out


@FAST
@given(
    mixtures(max_total=80),
    st.integers(1, 8),
    st.integers(0, 3),
    st.integers(1, 8),
    st.integers(0, 3),
    st.sampled_from(["pad", "drop"]),
    st.booleans(),
    st.sampled_from([2, 3]),
    st.data(),
)
def test_resume_at_a_random_point_onto_another_world(
    mixture: tuple[list[float], list[int], int],
    world: int,
    workers: int,
    new_world: int,
    new_workers: int,
    remainder: str,
    per_batch: bool,
    layout: int,
    data: st.DataObject,
) -> None:
    weights, _, total = mixture
    mix = mix_of(weights, total)
    epoch = 2
    runs = epoch_samples_of(mix, 3, epoch, layout)
    before = replace(mixture_config(world, workers, remainder, 3, per_batch), layout=layout)
    per_rank = samples_per_rank(total, world, remainder)  # type: ignore[arg-type]
    batches = data.draw(st.integers(0, -(-per_rank // 3)))
    segment = Segment(before, batches)
    taken = oracle_consumed(runs, before, epoch, batches)
    if layout == 2:
        consumed = consumed_runs(runs.runs, segment, epoch)  # type: ignore[union-attr]
        assert sorted((int(s), j) for s, a, b in consumed.tolist() for j in range(a, b)) == sorted(taken)
    rest = rest_of(runs, mix.counts, [segment], epoch)
    after = mixture_config(new_world, new_workers, remainder, 2, per_batch)
    yields = all_yields(rest, after, epoch)
    new_per_rank = samples_per_rank(rest.size, new_world, remainder)  # type: ignore[arg-type]
    for rank in range(new_world):
        assert sum(len(yields[rank, w]) for w in range(after.num_readers)) == new_per_rank
    seen = Counter(taken + [(s, j) for y in yields.values() for s, j, pad in y if not pad])
    assert all(n == 1 for n in seen.values())
    if remainder == "pad":
        assert len(seen) == total  # every sample of the epoch exactly once


@FAST
@given(mixtures(), st.integers(1, 8), st.integers(0, 3), st.integers(2, 6), st.sampled_from(["pad", "drop"]))
def test_per_batch_every_full_batch_of_every_rank_holds_its_share(
    mixture: tuple[list[float], list[int], int], world: int, workers: int, batch: int, remainder: str
) -> None:
    weights, _, total = mixture
    runs = epoch_sequence(mix_of(weights, total), 3, 0)
    config = mixture_config(world, workers, remainder, batch, per_batch=True)
    yields = all_yields(runs, config, 0)
    for rank in range(world):
        parts = [yields[rank, w] for w in range(config.num_readers)]
        cut = [[p[i : i + batch] for i in range(0, len(p), batch)] for p in parts]
        in_order = [cut[j % config.num_readers][j // config.num_readers] for j in range(sum(map(len, cut)))]
        share = Counter(s for b in in_order for s, _, _ in b)
        length = sum(share.values())
        for b in in_order:
            if len(b) == batch:
                got = Counter(s for s, _, _ in b)
                assert all(abs(got[s] - batch * n / length) < 1 for s, n in share.items())
