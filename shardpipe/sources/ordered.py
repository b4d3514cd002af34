"""One task per piece of a source, its results in piece order: how a file list and a Parquet dataset are
read, on the pack's pool or in this process by the same code."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Executor
from typing import TypeVar

P = TypeVar("P")
R = TypeVar("R")


def in_order(task: Callable[[P], R], pieces: Sequence[P], pool: Executor | None) -> Generator[R, None, None]:
    """``task(piece)`` of each piece, in piece order: on ``pool``, all submitted at once, or here one by
    one. Closing the generator early cancels the tasks not yet started."""
    if pool is None:
        for piece in pieces:
            yield task(piece)
        return
    futures = [pool.submit(task, piece) for piece in pieces]
    try:
        for future in futures:
            yield future.result()
    finally:
        for future in futures:
            future.cancel()
