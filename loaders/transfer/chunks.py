"""Several batches per worker message, cut apart in the main process in the DataLoader's own order.

Every item a DataLoader worker hands over costs the same fixed work on both sides (an index through the
index queue, a result through the result pipe, the main process's bookkeeping and wake-ups), whatever its
size; for batches of small samples that work, not the reading, sets the pace (docs/design.md, "Transfer"). So
when batches are small, a worker of the batch path cuts its stream into chunks of several consecutive
batches (as many as ``loaders.transfer.sizing.batches_per_chunk`` decides), and the main process cuts each
chunk back into those batches.

Invariants:

- a chunk holds consecutive batches of one worker's stream, cut at multiples of ``batch_size``, so
  cutting it apart gives exactly the batches the worker would have sent one by one;
- ``interleave`` yields them in the order the DataLoader delivers single batches: workers in turn from
  worker 0, a worker that has finished dropped from the turn. Position, resume and equal steps count
  batches in that order, so they hold unchanged;
- a worker's final chunk says so (``last``), even when it is empty, so the main process never waits for
  a chunk that will not come and holds at most one chunk per worker.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from loaders.transfer.collate import Batch, RaggedBytes


class Chunk(NamedTuple):
    """Consecutive batches of one worker as one batch (``None`` when the worker had none left)."""

    worker: int
    batch: Any  # a Batch; in a worker on its way through the ring, that ring's descriptor
    last: bool


def chunks(batches: Iterable[Batch], worker: int) -> Iterator[Chunk]:
    """Each batch as a chunk of ``worker``, the final one flagged ``last`` (an empty stream still sends
    one, with no batch): a chunk is held back until the next is cut, which is how it knows it is not the
    last."""
    previous: Batch | None = None
    for batch in batches:
        if previous is not None:
            yield Chunk(worker, previous, False)
        previous = batch
    yield Chunk(worker, previous, True)


def cut(batch: Batch | None, batch_size: int) -> Iterator[Batch]:
    """The batches of ``batch_size`` a chunk holds, in order (the last may be shorter). Their byte fields
    are views of the chunk's buffers, never copies: a batch a user keeps keeps its chunk's bytes."""
    if batch is None:
        return
    total = len(batch["__key__"])
    for start in range(0, total, batch_size):
        stop = min(start + batch_size, total)
        yield Batch({name: _cut_value(value, start, stop) for name, value in batch.items()})


def _cut_value(value: Any, start: int, stop: int) -> Any:
    if isinstance(value, RaggedBytes):
        offsets = value.offsets[start : stop + 1]
        first = int(offsets[0])
        return RaggedBytes(memoryview(value.buffer)[first : int(offsets[-1])], offsets - first)
    return value[start:stop]  # keys (a list) and per-sample tensors


def interleave(chunks: Iterator[Chunk], num_workers: int, batch_size: int) -> Iterator[Batch]:
    """The chunks' batches in the DataLoader's order for single batches (see the module doc)."""
    pending: list[deque[Batch]] = [deque() for _ in range(num_workers)]
    finished = [False] * num_workers
    turn = list(range(num_workers))
    i = 0
    while turn:
        i %= len(turn)
        worker = turn[i]
        while not pending[worker] and not finished[worker]:
            chunk = next(chunks, None)
            if chunk is None:
                raise RuntimeError(f"loader worker {worker} stopped without its last chunk")
            pending[chunk.worker].extend(cut(chunk.batch, batch_size))
            finished[chunk.worker] = chunk.last
        if pending[worker]:
            yield pending[worker].popleft()
            i += 1
        else:
            del turn[i]
