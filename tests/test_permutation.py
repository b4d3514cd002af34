"""The seeded permutations computed per index (``loaders.planning.permutation``): bijections, inverses,
blocks kept whole, and a look as uniform as a drawn permutation's."""

from __future__ import annotations

import numpy as np
import pytest

from loaders.planning.permutation import TABLE_SIZE, BlockPermutation, _cycle_walk, permute, unpermute


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 64, 1000, TABLE_SIZE + 3])
def test_a_bijection_and_its_inverse(n: int) -> None:
    values = permute(np.arange(n), n, (4, 2))
    assert np.array_equal(np.sort(values), np.arange(n))
    assert np.array_equal(unpermute(values, n, (4, 2)), np.arange(n))


def test_the_table_and_the_cycle_walk_agree() -> None:
    """Small permutations are looked up in a table of the same cipher: the values do not depend on it."""
    n = 5000
    assert np.array_equal(permute(np.arange(n), n, (9,)), _cycle_walk(np.arange(n), n, (9,), inverse=False))


def test_large_domains_take_any_index() -> None:
    n = 10**10
    picks = np.array([0, 1, 12345678901 % n, n - 1])
    values = permute(picks, n, (1, 2))
    assert values.min() >= 0 and values.max() < n and len(set(values.tolist())) == 4
    assert np.array_equal(unpermute(values, n, (1, 2)), picks)
    with pytest.raises(ValueError, match="indices must lie in"):
        permute([n], n, (1,))


def test_positions_move_as_a_drawn_permutation_moves_them() -> None:
    """Over many seeds, where index i lands is spread evenly (chi-square against uniform), and two seeds
    agree about as often as two drawn permutations (one fixed point expected)."""
    n, seeds = 16, 4000
    landing = np.array([permute(np.arange(n), n, (seed,)) for seed in range(seeds)])  # (seeds, n)
    counts = np.stack([np.bincount(landing[:, i], minlength=n) for i in range(n)])
    expected = seeds / n
    chi2 = ((counts - expected) ** 2 / expected).sum(axis=1)  # per index, n - 1 degrees of freedom
    assert chi2.max() < 60  # 15 dof: p < 1e-6 above 52
    fixed = (landing[1:] == landing[:-1]).sum(axis=1)
    assert 0.8 < fixed.mean() < 1.2


@pytest.mark.parametrize("length", [1, 7, 64, 1001])
@pytest.mark.parametrize("block", [1, 4, 64])
@pytest.mark.parametrize("entropy", [None, (3,), (3, 1, 4)])
def test_block_permutation_keeps_blocks_whole(
    length: int, block: int, entropy: tuple[int, ...] | None
) -> None:
    blocks = BlockPermutation(length, block, entropy)
    shown = blocks.source(np.arange(length))
    assert np.array_equal(np.sort(shown), np.arange(length))
    assert np.array_equal(blocks.stream(shown), np.arange(length))
    starts = np.flatnonzero(np.diff(shown, prepend=-2) != 1)  # where a contiguous read begins
    assert np.all(shown[starts] % block == 0)  # each read starts a block
    assert len(starts) <= blocks.num_blocks
