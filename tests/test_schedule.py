"""The stage schedule by range (:mod:`loaders.planning.schedule`), over random and skewed mixtures: each
source's samples exactly once and in order, ranges and prefix counts that agree with the whole stage,
the proved prefix bound (measured exactly), stages of 10^10 positions against a plain-int descent, and
a schedule that is a function of its entropy."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from loaders.planning.schedule import INT64_TOTAL, ScheduleTree, counts_before, schedule_tree, sources_at

RECIPROCAL_FIBONACCI = 3.3599  # sum of 1 / F_n, F_1 = F_2 = 1 (3.35988566...)


def random_counts(rng: np.random.Generator, k: int, total: int) -> list[int]:
    """Counts of one of several shapes: uniform, Dirichlet, skewed, geometric, Fibonacci-deep."""
    shape = rng.integers(6)
    weights: np.ndarray
    if shape == 0:
        weights = np.ones(k)
    elif shape == 1:
        weights = rng.dirichlet(np.full(k, rng.choice([0.1, 1.0, 10.0])))
    elif shape == 2:  # one source 0.7, the rest share 0.3
        weights = np.append(0.7, np.full(k - 1, 0.3 / max(k - 1, 1)))[:k]
    elif shape == 3:
        weights = 0.5 ** np.arange(k)
    elif shape == 4:  # Fibonacci counts make the deepest Huffman trees
        fib = [1, 1]
        while len(fib) < k:
            fib.append(fib[-1] + fib[-2])
        return [f * int(rng.integers(1, 4)) + int(rng.integers(0, 2)) for f in rng.permutation(fib[:k])]
    else:
        weights = rng.random(k)
    counts = rng.multinomial(total, weights / weights.sum()).tolist()
    if rng.random() < 0.3 and k > 1:  # a few sources with no samples at all
        counts = [0 if rng.random() < 0.3 else c for c in counts]
    return [int(c) for c in counts]


def cases(number: int, max_k: int = 16, max_total: int = 3000) -> list[tuple[list[int], list[int]]]:
    """``(counts, entropy)`` of random stages, fixed by a seed so every run checks the same ones."""
    rng = np.random.default_rng(20240611)
    out = []
    for _ in range(number):
        k = int(rng.integers(1, max_k + 1))
        counts = random_counts(rng, k, int(rng.integers(1, max_total + 1)))
        out.append((counts, [int(x) for x in rng.integers(0, 2**32, size=int(rng.integers(1, 4)))]))
    return out


CASES = cases(400)


def worst_deviations(source: np.ndarray, j: np.ndarray, counts: list[int]) -> list[int]:
    """Each source's max over p of ``|N c_s(p) - p n_s|``, exactly: the extremes are just after and just
    at each of its positions t_j (c_s = j + 1 at p = t_j + 1, c_s = j at p = t_j)."""
    total, out = sum(counts), []
    for s, n in enumerate(counts):
        t = np.flatnonzero(source == s)
        assert np.array_equal(j[t], np.arange(n))
        after = total * (np.arange(n) + 1) - (t + 1) * n
        at = t * n - total * np.arange(n)
        out.append(int(max(0, after.max(initial=0), at.max(initial=0))))
    return out


def path_sums(tree: ScheduleTree) -> dict[int, Fraction]:
    """Each positive source's ``sum(n_s / n_A)`` over its path below the root (rule 4)."""
    parent = {int(c): node for node, c in enumerate(tree.first) if c >= 0}
    parent |= {int(c): node for node, c in enumerate(tree.second) if c >= 0}
    out = {}
    for leaf, s in enumerate(tree.source.tolist()):
        if s < 0:
            continue
        node, total = leaf, Fraction(0)
        while node != tree.root:
            total += Fraction(int(tree.weight[leaf]), int(tree.weight[node]))
            node = parent[node]
        out[s] = total
    return out


def reference(tree: ScheduleTree, position: int) -> tuple[int, int]:
    """``(source, j)`` of one position by rule 2 as written, in plain Python ints."""
    node, q = tree.root, position
    while tree.first[node] >= 0:
        a, b = int(tree.first[node]), int(tree.second[node])
        n_p, n_a = int(tree.weight[node]), int(tree.weight[a])

        def c_a(q: int, n_p: int = n_p, n_a: int = n_a) -> int:
            return (2 * q * n_a + n_p) // (2 * n_p)

        node, q = (a, c_a(q)) if c_a(q + 1) > c_a(q) else (b, q - c_a(q))
    return int(tree.source[node]), q


@pytest.mark.parametrize("part", range(4))
def test_every_sample_exactly_once_and_in_order(part: int) -> None:
    for counts, entropy in CASES[part::4]:
        tree = schedule_tree(counts, entropy)
        source, j = sources_at(tree, 0, sum(counts))
        assert source.dtype == j.dtype == np.int64 and len(source) == sum(counts)
        assert np.bincount(source, minlength=len(counts)).tolist() == counts
        for s, n in enumerate(counts):  # j runs 0..n_s - 1 along the positions: each (s, j) once
            assert np.array_equal(j[source == s], np.arange(n))


@pytest.mark.parametrize("part", range(4))
def test_ranges_and_prefix_counts_agree_with_the_whole_stage(part: int) -> None:
    rng = np.random.default_rng(part)
    for counts, entropy in CASES[part::4]:
        tree = schedule_tree(counts, entropy)
        total = sum(counts)
        source, j = sources_at(tree, 0, total)
        prefix = np.vstack([np.zeros(len(counts), dtype=np.int64), np.cumsum(np.eye(len(counts))[source], 0)])
        for _ in range(3):
            a, b = sorted(rng.integers(0, total + 1, size=2).tolist())
            got_source, got_j = sources_at(tree, a, b)
            assert np.array_equal(got_source, source[a:b]) and np.array_equal(got_j, j[a:b])
            assert counts_before(tree, a) == tuple(prefix[a].astype(int).tolist())
        assert counts_before(tree, 0) == (0,) * len(counts)
        assert counts_before(tree, total) == tuple(counts)


def test_every_prefix_is_within_the_proved_bound() -> None:
    """Within one sample for up to three sources, under two (1.68) for up to 16; and each source within
    half its own path sum, which stays below the reciprocal Fibonacci constant."""
    worst = {1: Fraction(0), 3: Fraction(0), 16: Fraction(0)}
    for counts, entropy in [*CASES, *cases(200, max_k=3)]:
        tree = schedule_tree(counts, entropy)
        total = sum(counts)
        if not total:
            continue
        deviations = worst_deviations(*sources_at(tree, 0, total), counts)
        for s, bound in path_sums(tree).items():
            assert bound < RECIPROCAL_FIBONACCI
            assert 2 * deviations[s] <= bound * total
        positive = sum(c > 0 for c in counts)
        size = 1 if positive <= 1 else 3 if positive <= 3 else 16
        worst[size] = max(worst[size], Fraction(max(deviations), total))
    assert worst[1] == 0
    assert worst[3] < 1
    assert worst[16] < Fraction(168, 100)


@pytest.mark.parametrize(
    "counts",
    [
        [6_000_000_000, 3_000_000_000, 1_000_000_007],
        [2**31 - 1],
        [2**30, 2**30 - 1, 0],  # the int64 path's largest stage: 2 q n_A + n_P just under 2^63
        [2**30, 2**30],  # the smallest stage on Python ints
        [2**40 + 3, 3 * 2**38 + 1, 2**34 + 5, 0, 2**36 - 7],
        [
            int(x)
            for x in np.random.default_rng(5).multinomial(
                10**10, np.random.default_rng(6).dirichlet([1] * 20)
            )
        ],
    ],
)
def test_huge_stages_agree_with_a_plain_int_descent(counts: list[int]) -> None:
    tree = schedule_tree(counts, [3, 1, 4])
    total = sum(counts)
    assert tree.weight.dtype == (np.int64 if total < INT64_TOTAL else object)
    rng = np.random.default_rng(total % 2**32)
    for begin in [0, total - 1000, *(int(x) for x in rng.integers(0, total - 1000, size=3))]:
        source, j = sources_at(tree, begin, begin + 1000)
        assert list(zip(source.tolist(), j.tolist(), strict=True)) == [
            reference(tree, p) for p in range(begin, begin + 1000)
        ]
        before, after = counts_before(tree, begin), counts_before(tree, begin + 1000)
        assert [a - b for a, b in zip(after, before, strict=True)] == np.bincount(
            source, minlength=len(counts)
        ).tolist()
        for s in set(source.tolist()):  # each source's first sample in the range continues its prefix
            assert j[np.flatnonzero(source == s)[0]] == before[s]
    assert counts_before(tree, total) == tuple(counts)


def test_the_schedule_is_a_function_of_its_entropy() -> None:
    counts = [7, 7, 7, 7, 3, 3]  # ties and child orders leave many trees to choose from
    tree = schedule_tree(counts, [11, 2, 0])
    again = schedule_tree(counts, [11, 2, 0])
    (source, j), (source_again, j_again) = sources_at(tree, 0, 34), sources_at(again, 0, 34)
    assert np.array_equal(source, source_again) and np.array_equal(j, j_again)
    orders = {tuple(sources_at(schedule_tree(counts, [11, 2, e]), 0, 34)[0].tolist()) for e in range(8)}
    assert len(orders) >= 4


def test_out_of_range_and_bad_counts_raise() -> None:
    tree = schedule_tree([2, 0, 3], [0])
    with pytest.raises(ValueError, match="not within"):
        sources_at(tree, 2, 6)
    with pytest.raises(ValueError, match="not within"):
        sources_at(tree, 3, 2)
    with pytest.raises(ValueError, match="not within"):
        counts_before(tree, 6)
    with pytest.raises(ValueError, match="negative"):
        schedule_tree([2, -1], [0])
    empty = schedule_tree([0, 0], [0])
    assert [len(x) for x in sources_at(empty, 0, 0)] == [0, 0] and counts_before(empty, 0) == (0, 0)
