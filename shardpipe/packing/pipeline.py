"""``pack``: source -> split -> plan -> write -> manifest.

The flow: scan the source (:mod:`shardpipe.sources`), plan every shard once (:mod:`.plan`: split, order,
cuts, the job fingerprint), make OUT ready (:mod:`.output`: journal, resume, overwrite), write the shards
not already done (:mod:`.write`) on an engine (:mod:`.engine`), then commit the manifest last and remove
the journal. SRC and OUT may each be a local path or a URL: every step goes through the storage seam, so
the flow is the same for both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from shardpipe.formats import format_info
from shardpipe.manifest import Manifest, ShardEntry
from shardpipe.packing.engine import local_pool, run_tasks
from shardpipe.packing.options import PackOptions
from shardpipe.packing.output import Job, Output
from shardpipe.packing.plan import fingerprint, plan_jobs
from shardpipe.packing.write import write_shard
from shardpipe.process_settings import pausing_gc
from shardpipe.progress import Progress
from shardpipe.sources import scan_source
from shardpipe.storage import as_location, open_writable_store, redact_url


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
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: PackOptions,
    *,
    quiet: bool = False,
    executor: Executor | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> PackResult:
    """Pack ``src`` (a folder tree or a file list) into shards and a manifest in ``out``.

    The scan and the shard writes run on ``executor``; ``None`` is a local process pool of
    ``options.workers`` processes (this process alone for one). The output is the same whatever runs it
    (:mod:`shardpipe.packing.engine`). ``src`` and ``out`` may be URLs; ``storage_options`` go to every store
    they need (fsspec's filesystem options).
    """
    with pausing_gc():
        if executor is not None:
            return _pack(src, out, options, quiet, executor, storage_options)
        with local_pool(options.workers) as pool:
            return _pack(src, out, options, quiet, pool, storage_options)


def _pack(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: PackOptions,
    quiet: bool,
    executor: Executor | None,
    storage_options: Mapping[str, Any] | None,
) -> PackResult:
    src, out = as_location(src), as_location(out)
    target = Output(open_writable_store(out, storage_options=storage_options, action="pack to"))
    scan = scan_source(
        src,
        labels=options.labels,
        literal_fields=options.literal_fields,
        skip_incomplete=options.skip_incomplete,
        pool=executor,
        storage_options=storage_options,
    )
    jobs = plan_jobs(scan.table, format_info(options.format).suffix, options)
    source = redact_url(str(src)) if isinstance(src, str) else os.fspath(src)  # never a credential
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
    for entry in run_tasks(write_shard, todo, (target.store, options.format, storage_options), executor):
        target.record(entry)
        written[entry.path] = entry
        progress.update(entry.num_samples, entry.num_bytes)
    progress.close()

    entries = {**reused, **written}
    manifest = Manifest(
        format=options.format,
        fields=scan.table.fields,
        classes=scan.classes,
        splits={name: tuple(entries[j.relpath] for j in jobs if j.split == name) for name in options.split},
        source={"kind": scan.kind, "path": source, "labels": options.labels},
        split_rule=options.split_rule(),
        shard_limits=options.shard_limits(),
        order=options.order_rule(),
        job=job.to_json(),
    )
    target.commit(manifest)
    return PackResult(manifest, len(written), len(reused), *counts)
