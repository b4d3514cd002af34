"""``shardpipe pack``: source -> split -> plan -> write -> manifest.

The flow: scan the source (``shardpipe.sources``), plan every shard once (``shardpipe.plan``: split,
order, cuts, the job fingerprint), make OUT ready (``shardpipe.output``: journal, resume, overwrite),
write the shards not already done (``shardpipe.write``), then write the manifest last, atomically, and
remove the journal.

**The engine seam.** The work runs on a ``concurrent.futures.Executor``: ``pack(..., executor=None)``
uses a local process pool of ``options.workers`` processes, or this process when ``workers == 1``; any
other executor (a cluster engine's) may be passed instead. The contract an executor must honour, and
that this code keeps for it:

* Three kinds of task are submitted: ``shardpipe.sources.scan_names(chunk)`` (list one folder's names),
  ``shardpipe.list_piece.read_list_piece(source, piece, whole)`` (read, check and size one piece of a
  file list) and ``shardpipe.write.write_shard(job, out, format_name)`` (write one shard). All are
  module-level functions; their arguments and results (tuples, lists, ``str``, ``Path``, ``ListSource``,
  ``PieceColumns``, ``ShardJob``, ``ShardEntry``) and their errors (``shardpipe.errors`` types) pickle.
* A task's result depends only on its arguments, never on the process, machine or order that ran it: the
  plan is made once, here, before any task runs. So any executor gives byte-identical shards and
  manifest, and retrying a task is safe (a shard is written under a temporary name and renamed).
* Tasks read SRC and write OUT by path: the executor's workers must see both at the same paths. When OUT
  is a URL the write task is ``shardpipe.store_output.write_and_upload(job, store, format_name, options)``
  (write into a staging folder of the worker's own, upload, check) and workers need only reach the store;
  URLs in SRC are read through the storage seam likewise.
* Results are consumed as they complete; the journal and the manifest are written only by this process.

Where OUT lives is :mod:`shardpipe.output`'s business (``open_output``: a local folder, or an object-store
prefix): this module talks to either through the same few calls.

The local pool's workers also keep freed memory and pause the cyclic GC (``process_settings``): speed
only, which another executor may skip.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Executor, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardpipe.formats import get_format
from shardpipe.manifest import Manifest, ShardEntry
from shardpipe.output import Job, Writer, open_output
from shardpipe.plan import PackOptions, ShardJob, fingerprint, plan_jobs
from shardpipe.process_settings import keep_freed_memory, pausing_gc
from shardpipe.progress import Progress
from shardpipe.sources import scan_source
from shardpipe.split import SPLIT_METHOD
from shardpipe.storage import as_location, is_remote, redact_url

__all__ = ["PackOptions", "PackResult", "pack"]


@dataclass(frozen=True, slots=True)
class PackResult:
    manifest: Manifest
    num_written: int
    num_reused: int
    num_skipped_incomplete: int
    num_ignored_files: int
    already_complete: bool = False
    """True when ``resume`` found this job already finished in OUT: nothing was written."""


def pack(
    src: Path | str,
    out: Path | str,
    options: PackOptions,
    *,
    quiet: bool = False,
    executor: Executor | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> PackResult:
    """Pack ``src`` into ``out``, running the scan and the shard writes on ``executor``.

    ``executor=None``: a local process pool of ``options.workers`` processes, or this process alone when
    ``workers == 1``. The output is the same whatever runs it (see the module docstring). ``src`` and
    ``out`` may be URLs; ``storage_options`` go to every store they need (fsspec's filesystem options).
    """
    with pausing_gc():
        if executor is not None or options.workers == 1:
            return _pack(src, out, options, quiet, executor, storage_options)
        with ProcessPoolExecutor(max_workers=options.workers, initializer=init_worker) as pool:
            return _pack(src, out, options, quiet, pool, storage_options)


def init_worker() -> None:
    """Per-process set-up of a pack worker (also given to a Ray engine's workers): speed only."""
    keep_freed_memory()
    gc.disable()  # a pack worker's objects hold no cycles: see pausing_gc


def _pack(
    src: Path | str,
    out: Path | str,
    options: PackOptions,
    quiet: bool,
    executor: Executor | None,
    storage_options: Mapping[str, Any] | None,
) -> PackResult:
    fmt = get_format(options.format)
    src, out = as_location(src), as_location(out)
    target = open_output(out, storage_options)
    scan = scan_source(
        src,
        labels=options.labels,
        literal_fields=options.literal_fields,
        skip_incomplete=options.skip_incomplete,
        pool=executor,
        storage_options=storage_options,
    )
    jobs = plan_jobs(scan.table, fmt.suffix, options)
    source = redact_url(str(src)) if is_remote(src) else os.fspath(src)  # never a credential in a record
    job = Job(fingerprint(jobs, options), options.job_options(), source)
    prepared = target.prepare(job, resume=options.resume, overwrite=options.overwrite)
    counts = (scan.num_skipped_incomplete, scan.num_ignored_files)
    if prepared.complete is not None:
        num_shards = sum(len(shards) for shards in prepared.complete.splits.values())
        return PackResult(prepared.complete, 0, num_shards, *counts, already_complete=True)
    reused = {j.relpath: e for j in jobs if (e := target.reusable(prepared.finished.get(j.relpath)))}
    todo = [j for j in jobs if j.relpath not in reused]

    progress = Progress(f"pack {options.format}", sum(len(j.samples) for j in jobs), quiet=quiet)
    progress.update(sum(e.num_samples for e in reused.values()), sum(e.num_bytes for e in reused.values()))
    written: dict[str, ShardEntry] = {}
    writer = target.writer(options.format, storage_options)
    with target.journal() as record:
        for entry in _run(todo, writer, executor):
            record(entry)
            written[entry.path] = entry
            progress.update(entry.num_samples, entry.num_bytes)
    progress.close()

    entries = {**reused, **written}
    manifest = Manifest(
        format=options.format,
        fields=scan.table.fields,
        classes=scan.classes,
        splits={name: tuple(entries[j.relpath] for j in jobs if j.split == name) for name in options.split},
        split_rule={"method": SPLIT_METHOD, "seed": options.seed, "fractions": options.split},
        source={"kind": scan.kind, "path": source, "labels": options.labels},
        shard_limits={"max_samples": options.max_samples, "max_bytes": options.max_bytes},
        order=options.order_rule(),
        job=job.to_json(),
    )
    target.commit(manifest)
    return PackResult(manifest, len(written), len(reused), *counts)


def _run(jobs: list[ShardJob], writer: Writer, executor: Executor | None) -> Iterator[ShardEntry]:
    """Write shards, yielding each entry as it completes; in this process without an executor."""
    task, args = writer
    if executor is None:
        for job in jobs:
            yield task(job, *args)
        return
    pending = {executor.submit(task, job, *args) for job in jobs}
    try:
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()
    finally:
        for future in pending:
            future.cancel()
