"""A loader's transfer sizes (batches a message, prefetch, ring slots), as one pure function: a table of
the dataset's figures and the machine's room against what it decides."""

from __future__ import annotations

from typing import Any

import pytest

from loaders.transfer import sizing as sz
from loaders.transfer.sizing import (
    CHUNK_SAMPLES,
    MAX_CHUNK_BYTES,
    PREFETCH,
    PREFETCH_MAX_BYTES,
    TransferSizes,
    batches_per_chunk,
    prefetch_for,
    slot_bytes_for,
    transfer_sizes,
    uses_ring,
)
from shardpipe.errors import UsageError

GIB = 1 << 30
SMALL = {"batch_size": 64, "batch_bytes": 6400.0, "window": 1024, "whole_windows": False}
LARGE = {"batch_size": 8, "batch_bytes": 400_000.0, "window": 1024, "whole_windows": True}


@pytest.mark.parametrize(
    ("figures", "changes", "expected"),
    [
        # 64 small samples a batch: 16 batches (a window) a message; 4 ready; a message of 100 KiB takes
        # the ring, 6 slots of 1.5 messages plus offsets.
        (SMALL, {}, TransferSizes(16, 4, (6, 219_200))),
        (SMALL, {"shm_free": 5_260_799}, TransferSizes(16, 4, None)),  # one byte short of twice the ring
        (SMALL, {"transport": "pipe"}, TransferSizes(16, 4, None)),
        (SMALL, {"prefetch_factor": 9}, TransferSizes(16, 9, (11, 219_200))),  # the user's depth, kept
        (SMALL, {"batched": False}, TransferSizes(1, 4, None)),  # samples collated by the DataLoader
        (SMALL, {"workers": 0}, TransferSizes(1, None, None)),
        # 8 large samples a batch, a window handed over whole: 16 batches a message (8 MiB at most, a
        # divisor of the window's 128), 5 messages ready (32 MiB), 7 slots of 9.6 MB each...
        (LARGE, {}, TransferSizes(16, 5, (7, 9_608_256))),
        # ...and where /dev/shm cannot hold that ring, the floor's depth and the pipe.
        (LARGE, {"shm_free": 64 << 20}, TransferSizes(16, 4, None)),
    ],
)
def test_transfer_sizes_follow_the_figures(
    figures: dict[str, Any], changes: dict[str, Any], expected: TransferSizes
) -> None:
    given = {"workers": 2, "batched": True, "prefetch_factor": None, "transport": "auto", "shm_free": GIB}
    assert transfer_sizes(**{**given, **figures, **changes}) == expected


def test_a_ring_that_cannot_fit_is_refused_and_an_unknown_transport_too() -> None:
    given = {**SMALL, "workers": 2, "batched": True, "prefetch_factor": None, "shm_free": 1 << 20}
    with pytest.raises(UsageError, match="transport='ring' needs"):
        transfer_sizes(**given, transport="ring")
    with pytest.raises(ValueError, match="transport must be one of"):
        transfer_sizes(**given, transport="shm")


def test_prefetch_holds_a_window_and_a_message_more_within_a_byte_cap() -> None:
    assert prefetch_for(16, 16, 1e6) == PREFETCH  # a window is one message: the floor
    assert prefetch_for(16, 2, 3e6) == 16 // 2 + 1  # a window of 8 messages, and one more
    assert prefetch_for(16, 3, 3e6) == 6 + 1  # the last message of a window is partly filled
    assert prefetch_for(16, 1, PREFETCH_MAX_BYTES / 7) == 7  # the byte cap decides
    assert prefetch_for(16, 1, PREFETCH_MAX_BYTES) == PREFETCH  # never below the floor
    assert prefetch_for(100, 1, 0.0) == 101  # nothing predicted: no byte cap


def test_batches_per_chunk_aims_at_a_sample_count_within_a_byte_cap() -> None:
    assert batches_per_chunk(64, 64 * 1024) == CHUNK_SAMPLES // 64
    assert batches_per_chunk(64, MAX_CHUNK_BYTES / 16) == 16  # the byte cap decides
    assert batches_per_chunk(64, MAX_CHUNK_BYTES / 10) == 9  # whole batches within the cap
    assert batches_per_chunk(64, MAX_CHUNK_BYTES / 3.5) == 3  # large batches share a message too
    assert batches_per_chunk(64, MAX_CHUNK_BYTES * 3) == 1  # one batch is already more
    assert batches_per_chunk(CHUNK_SAMPLES * 2, 100.0) == 1  # batches above the sample count
    assert batches_per_chunk(4, 0.0) == CHUNK_SAMPLES // 4


def test_batches_per_chunk_divides_a_window_of_whole_batches() -> None:
    """A message that spans two windows is copied together in the worker: where a window holds a whole
    number of batches, a message holds a number that divides it."""
    window = CHUNK_SAMPLES  # 16 batches of 64
    assert batches_per_chunk(64, MAX_CHUNK_BYTES / 10, window) == 8  # 9 fit; 8 divides 16
    assert batches_per_chunk(64, MAX_CHUNK_BYTES / 5.5, window) == 4  # 5 fit
    assert batches_per_chunk(64, MAX_CHUNK_BYTES / 3.5, window) == 2  # 3 fit
    assert batches_per_chunk(64, 64 * 1024, window) == 16  # the sample count already divides it
    assert batches_per_chunk(64, 64 * 1024, 512) == 8  # a window smaller than a message's sample count
    assert batches_per_chunk(64, 1024.0, 64) == 1  # a window per batch (a per-batch mixture)
    assert batches_per_chunk(64, MAX_CHUNK_BYTES / 10, 1000) == 9  # batches straddle windows anyway
    assert batches_per_chunk(64, MAX_CHUNK_BYTES * 3, window) == 1


def test_slot_sizing_and_the_auto_choice() -> None:
    assert slot_bytes_for(0, 64) == sz.MIN_SLOT_BYTES
    assert slot_bytes_for(64 * 65536, 64) == int(64 * 65536 * sz.HEADROOM) + 64 * 65
    assert slot_bytes_for(1e12, 64) == sz.MAX_SLOT_BYTES
    big, small = sz.AUTO_MIN_BATCH_BYTES, sz.AUTO_MIN_BATCH_BYTES - 1
    assert uses_ring("auto", big, 1 << 20, 1 << 30) and not uses_ring("auto", small, 1 << 20, 1 << 30)
    assert not uses_ring("auto", big, 1 << 30, 1 << 30)  # /dev/shm too small: the pipe
    assert uses_ring("ring", 0, 1 << 20, 1 << 30) and not uses_ring("pipe", big, 1 << 20, 1 << 30)
    with pytest.raises(UsageError, match="transport='ring' needs 1,073,741,824 bytes"):
        uses_ring("ring", big, 1 << 30, 1 << 30)
    with pytest.raises(ValueError, match="transport must be one of auto, pipe, ring, got 'shm'"):
        uses_ring("shm", big, 1, 1)
