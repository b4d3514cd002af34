"""Seeded permutations computed per index, in constant memory: what lets a plan of 10^10 samples be read
a window at a time without writing the permutation out. Pure: no I/O.

:func:`permute` is a bijection on [0, n) chosen by a seed: a balanced Feistel network over the smallest
even power of two >= n (six rounds of a 64-bit mixing function keyed by ``SeedSequence(entropy)``), with
cycle-walking back into [0, n) (at most 4x the domain, so about 2 steps on average). A Feistel network is
a permutation whatever its round function; with a pseudorandom round function and four or more rounds it
is indistinguishable from a uniform one (Luby and Rackoff), the construction of Grain's index shuffle.
:func:`unpermute` is its inverse.

:class:`BlockPermutation` lifts it to a stream of ``length`` positions cut into blocks of ``block_size``
consecutive positions (the last one shorter): the blocks are permuted, the positions inside a block keep
their order, so each block is still one contiguous read.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

ROUNDS = 6
TABLE_SIZE = 1 << 14
"""Up to this size, and four times the indices asked for, a permutation is computed whole once and looked
up (the same values, fewer calls)."""
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@lru_cache(maxsize=256)
def _keys(entropy: tuple[int, ...]) -> np.ndarray:
    return np.random.SeedSequence(list(entropy)).generate_state(ROUNDS, dtype=np.uint64)


def _mix(values: np.ndarray, key: np.uint64) -> np.ndarray:
    """The round function: splitmix64's finaliser of ``values ^ key`` (uint64 arithmetic wraps)."""
    z = values ^ key
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


def _half_bits(n: int) -> int:
    return max(1, ((n - 1).bit_length() + 1) // 2)


def _feistel(values: np.ndarray, half: int | np.ndarray, keys: np.ndarray, inverse: bool) -> np.ndarray:
    """Six rounds over ``values``; ``half`` and each round's key are one for all, or one per value."""
    shift = np.asarray(half, dtype=np.uint64)
    mask = (np.uint64(1) << shift) - np.uint64(1)
    left, right = values >> shift, values & mask
    if not inverse:
        for key in keys:
            left, right = right, left ^ (_mix(right, key) & mask)
    else:
        for key in keys[::-1]:
            left, right = right ^ (_mix(left, key) & mask), left
    return np.asarray((left << shift) | right)


def _walk(indices: np.ndarray | Sequence[int], n: int, entropy: Sequence[int], inverse: bool) -> np.ndarray:
    values = np.array(indices, dtype=np.int64, ndmin=1)
    if len(values) and (values.min() < 0 or values.max() >= n):
        raise ValueError(f"indices must lie in [0, {n})")
    if n <= 1:
        return values
    entropy = tuple(int(e) for e in entropy)
    if _tabled(n, entropy, len(values)):
        return _table(n, entropy, inverse)[values]
    distinct, where = _distinct(values)  # a window asks for each of its blocks many times
    return np.asarray(_cycle_walk(distinct, n, entropy, inverse)[where])


def _distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct, where)`` with ``distinct[where] == values``: a dense range needs no sort."""
    if not len(values):
        return values, values
    low, high = int(values.min()), int(values.max())
    if high - low < len(values):
        return np.arange(low, high + 1, dtype=values.dtype), values - low
    distinct, where = np.unique(values, return_inverse=True)
    return distinct, where.reshape(-1)


_asked: dict[tuple[int, tuple[int, ...]], int] = {}


def _tabled(n: int, entropy: tuple[int, ...], count: int) -> bool:
    """Whether to look a small permutation up in its table: at once where the table costs no more than
    the call, else from its second use (a pass asks each window; the first window need not wait)."""
    if n > TABLE_SIZE:
        return False
    if n <= max(4 * count, 256):
        return True
    if len(_asked) > 4096:
        _asked.clear()
    _asked[n, entropy] = _asked.get((n, entropy), 0) + 1
    return _asked[n, entropy] > 1


@lru_cache(maxsize=64)
def _table(n: int, entropy: tuple[int, ...], inverse: bool) -> np.ndarray:
    table = _cycle_walk(np.arange(n, dtype=np.int64), n, entropy, inverse=False)
    if inverse:
        table = np.argsort(table)
    table.setflags(write=False)
    return table


def _cycle_walk(values: np.ndarray, n: int, entropy: tuple[int, ...], inverse: bool) -> np.ndarray:
    half, keys = _half_bits(n), _keys(entropy)
    out = _feistel(values.astype(np.uint64), half, keys, inverse)
    outside = np.flatnonzero(out >= np.uint64(n))
    while len(outside):  # cycle-walking: the cycle through i returns to [0, n) within it
        out[outside] = _feistel(out[outside], half, keys, inverse)
        outside = outside[out[outside] >= np.uint64(n)]
    return out.astype(np.int64)


def permute_each(
    indices: np.ndarray, which: np.ndarray, sizes: Sequence[int], entropies: Sequence[Sequence[int]]
) -> np.ndarray:
    """``indices[i]`` under the bijection of [0, sizes[which[i]]) that ``entropies[which[i]]`` names: many
    permutations in one vectorised pass (a mixture's window asks each of its sources' passes for a few
    positions), the same values as :func:`permute` gives each."""
    values = np.asarray(indices, dtype=np.int64)
    bounds = np.asarray(sizes, dtype=np.int64)[which]
    if len(values) and (values.min() < 0 or np.any(values >= bounds)):
        raise ValueError("indices must lie in [0, size) of their permutation")
    pairs, where = _distinct((np.asarray(which, dtype=np.int64) << 40) | values)  # each (group, index) once
    which, values = pairs >> 40, pairs & ((1 << 40) - 1)  # sorted by group
    out = values.copy()  # a permutation of [0, 1) keeps its 0
    walk = []
    starts = np.searchsorted(which, np.arange(len(sizes) + 1))
    for group, (begin, end) in enumerate(itertools.pairwise(starts.tolist())):
        n, entropy = int(sizes[group]), tuple(int(e) for e in entropies[group])
        if begin == end or n <= 1:
            continue
        if _tabled(n, entropy, end - begin):
            out[begin:end] = _table(n, entropy, False)[values[begin:end]]
        else:
            walk.append(np.arange(begin, end))
    if walk:
        rows = np.concatenate(walk)
        group = which[rows]
        keys = np.stack([_keys(tuple(int(e) for e in entropy)) for entropy in entropies], axis=1)[:, group]
        halves = np.array([_half_bits(max(int(n), 1)) for n in sizes], dtype=np.uint64)[group]
        limit = np.asarray(sizes, dtype=np.uint64)[group]
        walked = _feistel(values[rows].astype(np.uint64), halves, keys, inverse=False)
        outside = np.flatnonzero(walked >= limit)
        while len(outside):
            walked[outside] = _feistel(walked[outside], halves[outside], keys[:, outside], inverse=False)
            outside = outside[walked[outside] >= limit[outside]]
        out[rows] = walked.astype(np.int64)
    return np.asarray(out[where])


def permute(indices: np.ndarray | Sequence[int], n: int, entropy: Sequence[int]) -> np.ndarray:
    """The images of ``indices`` under the seeded bijection of [0, n) that ``entropy`` names."""
    return _walk(indices, n, entropy, inverse=False)


def unpermute(values: np.ndarray | Sequence[int], n: int, entropy: Sequence[int]) -> np.ndarray:
    """The inverse of :func:`permute`: ``unpermute(permute(i, n, e), n, e) == i``."""
    return _walk(values, n, entropy, inverse=True)


@dataclass(frozen=True, slots=True)
class BlockPermutation:
    """A stream of ``length`` positions in blocks of ``block_size``, the blocks in a seeded order.

    Stream position x lies in the block at some slot of the stream; ``source(x)`` is the position it
    shows of the unpermuted range. The short last block may land at any slot: the slots after it start
    ``block_size - last`` positions earlier, which is all the arithmetic needs (no table of blocks).
    ``entropy`` None keeps the range's own order.
    """

    length: int
    block_size: int
    entropy: tuple[int, ...] | None

    @property
    def num_blocks(self) -> int:
        return -(-self.length // self.block_size)

    def _short_slot(self) -> tuple[int, int]:
        """``(slot, gap)``: where the last (short) block lands, and how much shorter than a block it is."""
        return _short_slot(self.length, self.block_size, self.entropy)

    def source(self, positions: np.ndarray) -> np.ndarray:
        """Range positions shown at stream ``positions`` (int64 array, each in [0, length))."""
        if self.entropy is None:
            return np.asarray(positions, dtype=np.int64)
        size = self.block_size
        slot, gap = self._short_slot()
        shifted = np.where(positions >= (slot + 1) * size - gap, positions + gap, positions)
        blocks = shifted // size
        return np.asarray(permute(blocks, self.num_blocks, self.entropy) * size + shifted % size)

    def stream(self, positions: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`source`: the stream positions that show range ``positions``."""
        if self.entropy is None:
            return np.asarray(positions, dtype=np.int64)
        size = self.block_size
        slot, gap = self._short_slot()
        slots = unpermute(positions // size, self.num_blocks, self.entropy)
        shifted = slots * size + positions % size
        return np.asarray(np.where(slots > slot, shifted - gap, shifted))


@lru_cache(maxsize=256)
def _short_slot(length: int, block_size: int, entropy: tuple[int, ...] | None) -> tuple[int, int]:
    blocks = -(-length // block_size)
    gap = blocks * block_size - length
    if entropy is None or gap == 0:
        return blocks - 1, gap
    return int(unpermute([blocks - 1], blocks, entropy)[0]), gap


def block_sources(
    positions: np.ndarray,
    which: np.ndarray,
    lengths: Sequence[int],
    block_sizes: Sequence[int],
    entropies: Sequence[Sequence[int]],
) -> np.ndarray:
    """:meth:`BlockPermutation.source` of many block permutations at once: ``positions[i]`` of the stream
    of ``BlockPermutation(lengths[g], block_sizes[g], entropies[g])``, ``g = which[i]``."""
    shorts = [_short_slot(int(n), int(b), tuple(int(x) for x in e)) for n, b, e in zip(lengths, block_sizes,
              entropies, strict=True)]  # fmt: skip
    slot = np.array([slot for slot, _ in shorts], dtype=np.int64)[which]
    gap = np.array([gap for _, gap in shorts], dtype=np.int64)[which]
    size = np.asarray(block_sizes, dtype=np.int64)[which]
    blocks = [-(-int(n) // int(b)) for n, b in zip(lengths, block_sizes, strict=True)]
    shifted = np.where(positions >= (slot + 1) * size - gap, positions + gap, positions)
    return np.asarray(permute_each(shifted // size, which, blocks, entropies) * size + shifted % size)
