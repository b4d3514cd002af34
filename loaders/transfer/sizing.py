"""How much a loader's workers send at once and keep ready: one pure function, decided once.

Every size of the trip from a DataLoader worker to the trainer follows from the dataset's figures (a
batch's bytes as the manifest predicts them, the window a worker reads whole) and the machine's room
(free shared memory): the batches one worker message carries, the DataLoader's ``prefetch_factor``, and
the shared ring's slots. :func:`transfer_sizes` computes all of them at once; ``make_loader`` applies the
result and nothing changes it afterwards. Why each rule: the docstrings below and
:mod:`loaders.transfer.chunks` (several batches a message), :mod:`loaders.transfer.transport` (the ring).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardpipe.errors import UsageError

TRANSPORTS = ("auto", "pipe", "ring")
CHUNK_SAMPLES = 1024
"""A worker sends about this many samples per message when its batches are smaller: a default window."""
MAX_CHUNK_BYTES = 8 << 20  # and no more bytes than this, as the manifest predicts them
PREFETCH = 4
"""Messages each worker keeps ready at least (the DataLoader's ``prefetch_factor``)."""
PREFETCH_MAX_BYTES = 32 << 20
"""More than ``PREFETCH`` messages a worker keeps ready only while they predict at most this many bytes."""
AUTO_MIN_BATCH_BYTES = 64 << 10
"""``transport="auto"`` takes the ring from this expected message size."""
EXTRA_SLOTS = 2  # over prefetch_factor: a worker rarely has more batches unread than it was asked for
MIN_SLOT_BYTES = 64 << 10
MAX_SLOT_BYTES = 64 << 20
HEADROOM = 1.5  # slot over the expected batch: batches of larger-than-mean samples still fit
SHM_SHARE = 0.5  # the most of /dev/shm's free space a ring may take


@dataclass(frozen=True, slots=True)
class TransferSizes:
    """What a loader sends and keeps: ``per_message`` batches a worker message, ``prefetch_factor``
    messages ready per worker (``None`` without workers, or as the user gave it), and the ring's
    ``(slots per worker, slot bytes)`` (``None``: batches go through the result pipe)."""

    per_message: int = 1
    prefetch_factor: int | None = None
    ring: tuple[int, int] | None = None


def transfer_sizes(
    *,
    workers: int,
    batch_size: int,
    batch_bytes: float,
    window: int,
    batched: bool,
    whole_windows: bool,
    prefetch_factor: int | None,
    transport: str,
    shm_free: int,
) -> TransferSizes:
    """The sizes of a loader with ``workers`` workers reading batches of ``batch_size`` samples that the
    manifest predicts at ``batch_bytes``, in windows of ``window`` samples (handed over all at once where
    ``whole_windows``); ``batched``: the workers build whole batches (the batch path), which a message may
    carry several of and the ring may carry. ``prefetch_factor`` as the user gave it (``None``: chosen
    here); ``shm_free``: free bytes in /dev/shm. Raises ``UsageError`` where ``transport="ring"`` does not
    fit."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    if workers == 0:
        return TransferSizes(prefetch_factor=prefetch_factor)
    per_message = batches_per_chunk(batch_size, batch_bytes, window) if batched else 1
    prefetch = prefetch_factor
    if prefetch_factor is None:  # ready: what a worker hands over at once, a window or a message
        at_once = max(per_message, -(-window // batch_size)) if whole_windows else per_message
        prefetch = prefetch_for(at_once, per_message, batch_bytes * per_message)
    if not batched or transport == "pipe":
        return TransferSizes(per_message, prefetch)
    message_bytes = batch_bytes * per_message
    slot_bytes = slot_bytes_for(message_bytes, batch_size * per_message)
    if prefetch_factor is None and prefetch is not None:
        # A prefetch deeper than PREFETCH only as far as its ring fits: the ring gains more than depth.
        fitting = int(shm_free * SHM_SHARE) // (workers * slot_bytes) - EXTRA_SLOTS
        prefetch = max(PREFETCH, min(prefetch, fitting))
    slots = (prefetch or 2) + EXTRA_SLOTS
    takes_ring = uses_ring(transport, message_bytes, workers * slots * slot_bytes, shm_free)
    return TransferSizes(per_message, prefetch, (slots, slot_bytes) if takes_ring else None)


def batches_per_chunk(batch_size: int, expected_batch_bytes: float, window_samples: int = 0) -> int:
    """How many batches one worker message carries: about ``CHUNK_SAMPLES`` samples, at most
    ``MAX_CHUNK_BYTES``, at least one batch; where a window (``window_samples``, the shuffle buffer) holds
    a whole number of batches, a number that divides it, so that no message spans two windows: the worker
    copies such a message's two parts together (``loaders.reading.columns.batches``). Every item a worker
    hands over costs the same fixed work on both sides, whatever its size, so small batches travel
    several to a message."""
    by_bytes = int(MAX_CHUNK_BYTES // expected_batch_bytes) if expected_batch_bytes > 0 else CHUNK_SAMPLES
    most = max(1, min(CHUNK_SAMPLES // batch_size, by_bytes))
    if window_samples <= 0 or window_samples % batch_size:
        return most
    per_window = window_samples // batch_size
    return max(n for n in range(1, min(most, per_window) + 1) if per_window % n == 0)


def prefetch_for(batches_at_once: int, batches_per_message: int, message_bytes: float) -> int:
    """The DataLoader's ``prefetch_factor`` (messages a worker keeps ready) that holds the batches a worker
    hands over at once (a window it reads whole) and one message more, at least ``PREFETCH``, larger only
    within ``PREFETCH_MAX_BYTES``. A worker that has read a window hands its messages over one at a time
    as the DataLoader asks, in turn with the other workers; holding fewer, it waits for the trainer to
    take them before it can read the next window, and the cores idle."""
    ready = -(-batches_at_once // max(batches_per_message, 1)) + 1
    fitting = int(PREFETCH_MAX_BYTES // message_bytes) if message_bytes > 0 else ready
    return max(PREFETCH, min(ready, fitting))


def slot_bytes_for(expected_batch_bytes: float, batch_size: int) -> int:
    """A slot for a batch of ``expected_batch_bytes`` with headroom, the offsets and pad flags, clamped."""
    size = int(expected_batch_bytes * HEADROOM) + 64 * (batch_size + 1)
    return min(max(size, MIN_SLOT_BYTES), MAX_SLOT_BYTES)


def uses_ring(transport: str, expected_batch_bytes: float, ring_bytes: int, shm_free: int) -> bool:
    """Whether a loader takes the ring: always for "ring" (if /dev/shm has room), from
    ``AUTO_MIN_BATCH_BYTES`` for "auto", never for "pipe"."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    fits = ring_bytes <= shm_free * SHM_SHARE
    if transport == "ring" and not fits:
        raise UsageError(
            f"transport='ring' needs {ring_bytes:,} bytes of shared memory, more than half of the "
            f"{shm_free:,} free in /dev/shm; use transport='pipe' or fewer workers or a smaller batch"
        )
    if transport == "auto":
        return fits and expected_batch_bytes >= AUTO_MIN_BATCH_BYTES
    return transport == "ring"
