"""The engine seam: who runs a pack's tasks. A local process pool by default; any
``concurrent.futures.Executor`` (``shardpipe.packing.ray_engine.RayExecutor`` on a cluster) otherwise.

The contract an executor must honour, and that the pack keeps for it:

* These tasks are submitted: ``shardpipe.sources.tree.scan_names(chunk)`` (list one folder's names),
  ``shardpipe.sources.list_piece.read_list_piece(source, piece, whole)`` (read, check and size one piece
  of a file list), ``shardpipe.sources.parquet_pieces.read_table_piece(piece)`` (read one run of a Parquet
  dataset's row groups), ``shardpipe.packing.shard_writing.write_shard(job, out, format_name,
  source_options)`` (write one shard into the store ``out``) and, for a pack with a map,
  ``shardpipe.packing.mapping.pieces.map_piece(...)`` and ``shardpipe.packing.mapping.shards.
  write_mapped_shard(job, out, format_name)``. All are module-level functions; their arguments and results
  (tuples, lists, ``str``, ``Path``, stores, the sources' pieces, ``ShardJob``, ``MapPiece``,
  ``MappedPiece``, ``MappedShardJob``, ``Transform``, ``ShardEntry``) and their errors (the project's
  types) pickle.
* A task's result depends only on its arguments, never on the process, machine or order that ran it: the
  plan is made once, before any task runs. So any executor gives byte-identical shards and manifest, and
  retrying a task is safe (a shard is staged under a temporary name and published whole).
* Tasks read SRC and write OUT by path or URL: for a local path, the executor's workers must see it at
  the same path; for a URL they need only reach the store.
* Results are consumed as they complete; the journal and the manifest are written only by the driver.

The local pool's workers end themselves when the driver dies, under every start method
(:mod:`.lifetime`), so a killed pack leaves no process behind; they also keep freed memory and pause the
cyclic GC, for speed only. :func:`init_worker` does all three. The Ray engine's workers run it too, where
only the speed settings apply: Ray ends a dead driver's workers itself (docs/ray.md).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, TypeVar

from shardpipe.packing import tally
from shardpipe.packing.lifetime import exit_with_driver
from shardpipe.packing.tally import Tally
from shardpipe.process_settings import keep_freed_memory

T = TypeVar("T")
POLL_S = 0.5


def init_worker(written: Tally | None = None) -> None:
    """Per-process set-up of a pack worker (also given to a Ray engine's workers): end with the driver,
    then speed; a local pool's workers also count what they write into the driver's ``written``."""
    exit_with_driver()
    keep_freed_memory()
    gc.disable()  # a pack worker's objects hold no cycles: see process_settings.pausing_gc
    tally.install(written)


@contextmanager
def local_pool(workers: int) -> Iterator[Executor | None]:
    """A process pool of ``workers`` processes, or None (this process runs every task) for one; either way
    what the shard writers write is counted (:mod:`.tally`) while the block runs."""
    written = tally.Tally()
    tally.install(written)
    try:
        if workers == 1:
            yield None
            return
        with ProcessPoolExecutor(max_workers=workers, initializer=init_worker, initargs=(written,)) as pool:
            yield pool
    finally:
        tally.install(None)


def run_tasks(
    task: Callable[..., T],
    items: Iterable[Any],
    args: tuple[Any, ...],
    executor: Executor | None,
    waiting: Callable[[], None] | None = None,
) -> Iterator[T]:
    """``task(item, *args)`` for every item, each result yielded as it completes; in this process without
    an executor. ``waiting`` is called every :data:`POLL_S` while tasks run elsewhere (a progress bar's
    refresh). On an error, the tasks not yet started are cancelled."""
    if executor is None:
        for item in items:
            yield task(item, *args)
        return
    pending = {executor.submit(task, item, *args) for item in items}
    try:
        while pending:
            done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
            if waiting is not None:
                waiting()
            for future in done:
                yield future.result()
    finally:
        for future in pending:
            future.cancel()
