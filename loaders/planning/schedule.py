"""A stage's mixture schedule by range: which source fills each position of one stage, and which of its
samples, for any range of positions without writing the stage out. Pure: no I/O.

:func:`loaders.planning.mixture.stage_schedule` writes all n positions of a stage at once; a stage of
10^10 positions cannot be written, yet a reader only needs its own range. Here the schedule is a binary
tree of two-way splits, so a position's source is a walk from the root, and a range is one vectorised
walk of all its positions: O(k log k) to build, O(depth) a position, nothing n-long.

Rules:
1. Tree. A Huffman tree over the sources with a positive count (a count-0 source never appears): merge
   the two nodes of smallest count until one is left. Ties go to the lower rank: leaf s ranks
   ``permutation(k)[s]`` of ``default_rng(SeedSequence(entropy))``, a merged node after every leaf and
   every earlier merged node. Which child of a merge is first is one draw of the same stream each
   (``integers(0, 2, size=merges)``, after the permutation). One positive source is a tree of one leaf.
2. Split. A merged node P of count n_P, first child A and second B, gives A ``c_A(q) = floor((2 q n_A +
   n_P) / (2 n_P))`` of its first q positions (q n_A / n_P rounded half up) and B the rest. P's local
   position q is A's, at A's local index c_A(q), when ``c_A(q + 1) > c_A(q)``; else B's, at q - c_A(q).
   The root's local position is the stage position; a leaf's local index is the source's sample j.
   ``c_A(n_P) = n_A``: every source gets exactly its count, j = 0..n_s - 1 in position order.
3. Exact. Integers only, never floats: int64 while the stage has under 2^31 positions (then
   ``2 q n_A + n_P < 2 N^2 < 2^63``), Python ints in object arrays from there (exact, about ten times slower).
4. Bound. Every split rounds by at most 1/2 at every q, and the roundings down a path add up scaled:
   ``|c_s(p) - p n_s / N| <= 1/2 * sum(n_s / n_A)`` over the nodes A on s's path below the root, s
   included. Huffman takes nodes out in nondecreasing count, and the sibling of u_{i+1} is taken out
   after u_i (with u_{i+1}, which u_i's merge made), so the counts up the path, u_0 = n_s, u_1, ...,
   grow at least like Fibonacci numbers: u_1 > u_0, u_{i+2} >= u_{i+1} + u_i. The terms are then
   1, < 1, < 1/2, < 1/3, < 1/5, ..., below the reciprocal Fibonacci constant 3.3599...: every prefix
   holds each source within 1.68 samples of its share for any k (any interval within 3.36), and within
   one for k <= 3 (depth at most 2, the sum at most 1 + n_s / (n_s + sibling) < 2). From four sources on
   a prefix can be off by more than one, unlike the quota order of layouts 1 and 2 (:mod:`.mixture`).
Nothing here depends on rank, worker, time or pid.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

INT64_TOTAL = 2**31  # stages below it split in int64 (rule 3), from it in Python ints
MAX_TOTAL = 2**63 - 1  # positions and j are returned as int64


@dataclass(frozen=True, slots=True, eq=False)
class ScheduleTree:
    """A stage's schedule (rules 1-2) as flat node arrays, so that a range descends all its positions at
    once by array indexing. Nodes 0..m-1 are the leaves (the positive sources in source order), then the
    merged nodes in merge order: children come before their parent, and the root is the last node."""

    counts: tuple[int, ...]  # each source's count in the stage, zeros included
    first: np.ndarray  # (nodes,) int64 first child A of a merged node, -1 at a leaf
    second: np.ndarray  # (nodes,) int64 second child B, -1 at a leaf
    weight: np.ndarray  # (nodes,) each node's count: int64, or object (Python ints) from INT64_TOTAL
    source: np.ndarray  # (nodes,) int64 source of a leaf, -1 at a merged node

    @property
    def total(self) -> int:
        """N, the stage's positions."""
        return sum(self.counts)

    @property
    def root(self) -> int:
        """The root node, -1 for an empty stage."""
        return len(self.weight) - 1


def schedule_tree(counts: Sequence[int], entropy: Sequence[int]) -> ScheduleTree:
    """The stage's tree (rule 1): built once in O(k log k), then any range is read from it."""
    counts = tuple(int(c) for c in counts)
    if any(c < 0 for c in counts):
        raise ValueError(f"counts must not be negative, got {counts}")
    total = sum(counts)
    if total > MAX_TOTAL:
        raise ValueError(f"a stage holds at most 2^63 - 1 positions, got {total}")
    rng = np.random.default_rng(np.random.SeedSequence(list(entropy)))
    ranks = rng.permutation(len(counts)).tolist()
    sources = [s for s, c in enumerate(counts) if c > 0]
    leaves = len(sources)
    flips = rng.integers(0, 2, size=max(leaves - 1, 0)).tolist()
    first, second = [-1] * leaves, [-1] * leaves
    weight = [counts[s] for s in sources]
    queue = [(counts[s], ranks[s], node) for node, s in enumerate(sources)]  # ranks are unique
    heapq.heapify(queue)
    for merge, flip in enumerate(flips):
        count_a, _, a = heapq.heappop(queue)
        count_b, _, b = heapq.heappop(queue)
        first.append(b if flip else a)
        second.append(a if flip else b)
        weight.append(count_a + count_b)
        heapq.heappush(queue, (count_a + count_b, len(counts) + merge, leaves + merge))
    source = sources + [-1] * len(flips)

    def frozen(values: list[int], dtype: type) -> np.ndarray:
        array: np.ndarray = np.array(values, dtype=dtype).reshape(-1)
        array.setflags(write=False)
        return array

    return ScheduleTree(
        counts=counts,
        first=frozen(first, np.int64),
        second=frozen(second, np.int64),
        weight=frozen(weight, np.int64 if total < INT64_TOTAL else object),
        source=frozen(source, np.int64),
    )


def sources_at(tree: ScheduleTree, begin: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """``(source, j)``, two ``(end - begin,)`` int64 arrays: the source filling each position of [begin,
    end) and that source's index j within the stage (rule 2). All positions step down one level together,
    those at a leaf drop out: O(depth * (end - begin)), whatever the stage's size."""
    begin, end = int(begin), int(end)
    if not 0 <= begin <= end <= tree.total:
        raise ValueError(f"range [{begin}, {end}) is not within the stage's {tree.total} positions")
    node = np.full(end - begin, tree.root, dtype=np.int64)
    local = np.arange(begin, end, dtype=tree.weight.dtype)  # each position's index within its node
    live = np.flatnonzero(tree.first[node] >= 0)  # positions not at a leaf yet
    while len(live):
        at, q = node[live], local[live]
        a = tree.first[at]
        n_p, n_a = tree.weight[at], tree.weight[a]
        scaled = 2 * q * n_a + n_p
        c_a = scaled // (2 * n_p)
        # c_A(q + 1) > c_A(q) iff the remainder of the floor above reaches 2 n_P - 2 n_A
        to_a = scaled - c_a * (2 * n_p) >= 2 * (n_p - n_a)
        node[live] = np.where(to_a, a, tree.second[at])
        local[live] = np.where(to_a, c_a, q - c_a)
        live = live[tree.first[node[live]] >= 0]
    return tree.source[node], local.astype(np.int64)


def counts_before(tree: ScheduleTree, position: int) -> tuple[int, ...]:
    """Each source's samples among the first ``position`` positions of the stage (zeros for count-0
    sources): the prefix count split down the tree by c_A, O(k). Where a reader starts in each source."""
    position = int(position)
    if not 0 <= position <= tree.total:
        raise ValueError(f"position {position} is not within the stage's {tree.total} positions")
    out = [0] * len(tree.counts)
    if tree.root < 0:
        return tuple(out)
    first, second, source = tree.first.tolist(), tree.second.tolist(), tree.source.tolist()
    weight = [int(w) for w in tree.weight]
    prefix = [0] * len(weight)
    prefix[tree.root] = position
    leaves = (len(weight) + 1) // 2
    for node in range(tree.root, leaves - 1, -1):  # merged nodes, every parent before its children
        a, q, n_p = first[node], prefix[node], weight[node]
        prefix[a] = (2 * q * weight[a] + n_p) // (2 * n_p)
        prefix[second[node]] = q - prefix[a]
    for node in range(leaves):
        out[source[node]] = prefix[node]
    return tuple(out)
