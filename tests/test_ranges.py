"""Coalescing byte ranges (pure): which reads share a request."""

from __future__ import annotations

import pytest

from shardpipe.errors import UsageError
from shardpipe.storage.ranges import coalesce_ranges, slice_blocks


def test_coalesce_ranges_merges_neighbours_within_the_gap_and_block() -> None:
    blocks, block_of = coalesce_ranges([(100, 200), (0, 50), (55, 90), (10_000, 10_010)], max_gap=5)
    assert blocks == [(0, 90), (100, 200), (10_000, 10_010)]
    assert block_of == [1, 0, 0, 2]
    blocks, _ = coalesce_ranges([(0, 10), (10, 20), (20, 30)], max_gap=0, max_block=20)
    assert blocks == [(0, 20), (20, 30)]
    blocks, block_of = coalesce_ranges([(0, 100)], max_block=10)
    assert blocks == [(0, 100)] and block_of == [0]
    blocks, _ = coalesce_ranges([(0, 100), (20, 30)], max_gap=0)
    assert blocks == [(0, 100)]
    with pytest.raises(UsageError, match=r"\(5, 2\) is invalid"):
        coalesce_ranges([(5, 2)])


def test_slice_blocks_cuts_each_range_back_out() -> None:
    data = bytes(range(200))
    ranges = [(150, 160), (0, 5), (3, 9)]
    blocks, block_of = coalesce_ranges(ranges, max_gap=10)
    fetched = [data[start:stop] for start, stop in blocks]
    assert slice_blocks(ranges, blocks, block_of, fetched) == [data[s:e] for s, e in ranges]
