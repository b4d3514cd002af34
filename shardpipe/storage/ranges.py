"""Coalescing byte ranges: neighbouring reads of one object become one request.

A request to an object store costs a round trip whatever its size, so ranges a few KiB apart are cheaper
fetched together; a cap on the merged size keeps a sparse read from pulling a whole shard. Pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardpipe.errors import UsageError

#: Neighbouring ranges closer than this are fetched as one request: a request costs a round trip.
DEFAULT_MAX_GAP = 64 * 1024
#: A coalesced request never spans more than this, so one sparse read does not pull a whole shard.
DEFAULT_MAX_BLOCK = 16 * 1024 * 1024


def coalesce_ranges(
    ranges: Sequence[tuple[int, int]], max_gap: int = DEFAULT_MAX_GAP, max_block: int = DEFAULT_MAX_BLOCK
) -> tuple[list[tuple[int, int]], list[int]]:
    """Merge neighbouring ``[start, stop)`` ranges: ``(blocks, block_of)``, ``block_of[i]`` for range i.

    Ranges at most ``max_gap`` apart (or overlapping) share a block unless it would pass ``max_block``
    bytes; one range longer than ``max_block`` still gets a block of its own.
    """
    for start, stop in ranges:
        if not 0 <= start <= stop:
            raise UsageError(f"byte range ({start}, {stop}) is invalid; need 0 <= start <= stop")
    order = sorted(range(len(ranges)), key=lambda i: ranges[i])
    blocks: list[tuple[int, int]] = []
    block_of = [0] * len(ranges)
    for i in order:
        start, stop = ranges[i]
        if blocks:
            first, last = blocks[-1]
            if start <= last + max_gap and max(last, stop) - first <= max_block:
                blocks[-1] = (first, max(last, stop))
                block_of[i] = len(blocks) - 1
                continue
        blocks.append((start, stop))
        block_of[i] = len(blocks) - 1
    return blocks, block_of


def slice_blocks(
    ranges: Sequence[tuple[int, int]],
    blocks: Sequence[tuple[int, int]],
    block_of: Sequence[int],
    data: Sequence[bytes],
) -> list[bytes]:
    """Cut each range back out of the bytes fetched for its block."""
    out = []
    for (start, stop), b in zip(ranges, block_of, strict=True):
        first = blocks[b][0]
        out.append(data[b][start - first : stop - first])
    return out
