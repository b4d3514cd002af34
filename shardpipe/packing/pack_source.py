"""``pack``: a source (a folder tree or a file list) -> split -> plan -> (map) -> write -> manifest.

The flow: scan the source (:mod:`shardpipe.sources`), plan the work once (:mod:`.plan`: split, order,
cuts, the job fingerprint), make OUT ready (:mod:`.output`: journal, resume, overwrite), do the work not
already done on an engine (:mod:`.driver`, :mod:`.engine`), then commit the manifest last and remove the
journal. SRC and OUT may each be a local path or a URL: every step goes through the storage seam.

Without a transform, each task writes one planned shard from its source files (:mod:`.shard_writing`).
With a map or the image preparation, tasks first map pieces of the inputs, then write shards of the
outputs (:mod:`.mapping`, which says why the cut stays a pure function of the ordered outputs). Python
items instead of a source: :mod:`.items`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any

from shardpipe.formats import format_info
from shardpipe.formats.compression import SAMPLE_COUNT
from shardpipe.packing.compressing import Compression, plan_compression, table_samples
from shardpipe.packing.driver import PackResult, job_manifest, map_all, write_all
from shardpipe.packing.engine import local_pool
from shardpipe.packing.mapping.pieces import MappedPiece, plan_pieces
from shardpipe.packing.mapping.shards import Outputs, plan_mapped_shards, staged_samples, write_mapped_shard
from shardpipe.packing.options import PackOptions
from shardpipe.packing.output import Job, Output
from shardpipe.packing.plan import fingerprint, plan_jobs
from shardpipe.packing.shard_writing import write_shard
from shardpipe.process_settings import pausing_gc
from shardpipe.progress import phase
from shardpipe.shardtable import ShardEntry
from shardpipe.sources import scan_source
from shardpipe.storage import as_location, open_writable_store, redact_url


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

    The scan, the map and the shard writes run on ``executor``; ``None`` is a local process pool of
    ``options.workers`` processes (this process alone for one). The output is the same whatever runs it
    (:mod:`shardpipe.packing.engine`). ``src`` and ``out`` may be URLs; ``storage_options`` go to every
    store they need (fsspec's filesystem options).
    """
    with pausing_gc():
        if executor is not None:
            return _pack(src, out, options, quiet, executor, storage_options)
        with local_pool(options.num_workers) as pool:
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
    shown = redact_url(src) if isinstance(src, str) else os.fspath(src)  # never a credential
    with phase("scan", f"listing {shown}", quiet=quiet):
        scan = scan_source(
            src,
            labels=options.labels,
            literal_fields=options.literal_fields,
            skip_incomplete=options.skip_incomplete,
            pool=executor,
            storage_options=storage_options,
            key_column=options.key_column,
            field_map=options.field_map,
        )
    suffix = format_info(options.format).suffix
    transform = options.transform()
    if options.split is None and scan.splits:
        options = replace(options, source_splits=scan.splits)
    jobs = plan_jobs(scan.table, suffix, options, scan.row_splits)
    pieces = plan_pieces(jobs, suffix) if transform is not None else []
    planned = [(p.relpath, p.samples) for p in pieces if p.samples is not None] or [
        (j.relpath, j.samples) for j in jobs
    ]
    job = Job(fingerprint(planned, options), options.job_options(), shown)
    prepared = target.prepare(job, resume=options.resume, overwrite=options.overwrite)
    if prepared.complete is not None:
        return PackResult(
            manifest=prepared.complete,
            num_written=0,
            num_reused=sum(len(shards) for shards in prepared.complete.splits.values()),
            num_skipped_incomplete=scan.num_skipped_incomplete,
            num_ignored_files=scan.num_ignored_files,
            already_complete=True,
            num_skipped_failed=int(prepared.complete.skipped.get("count", 0)),
        )

    mapped: list[MappedPiece] = []
    fields = scan.table.fields
    compression: Compression | None = None
    spec = options.compress_spec
    if transform is None:
        if spec is not None:
            with phase("compress", "sampling values and training dictionaries", quiet=quiet):
                samples = table_samples(scan.table, "the compression sample", storage_options)
                compression = plan_compression(
                    spec, fields, options.compress_fields, samples, options.max_bytes, target.store
                )
        write: Callable[..., ShardEntry] = write_shard
        args: tuple[Any, ...] = (target.store, options.format, storage_options)
        if compression is not None:  # passed only when there is one: the task's other callers are unchanged
            args += (compression.compressor,)
    else:
        map_args = (target.store, options.format, transform, options.on_error, storage_options)
        mapped = map_all(pieces, target, prepared, executor, quiet, map_args)
        outputs = Outputs.of(mapped)
        fields = outputs.fields
        jobs = plan_mapped_shards(  # type: ignore[assignment]
            outputs,
            outputs.by_piece_split(),
            suffix,
            max_samples=options.max_samples,
            max_bytes=options.max_bytes,
        )
        if spec is not None:
            with phase("compress", "sampling values and training dictionaries", quiet=quiet):
                samples = staged_samples(outputs, target.store, options.format, SAMPLE_COUNT)
                compression = plan_compression(
                    spec, fields, options.compress_fields, samples, options.max_bytes, target.store
                )
        write, args = write_mapped_shard, (target.store, options.format)
        if compression is not None:
            args += (compression.compressor,)
    entries, num_written, num_reused = write_all(
        jobs, write, args, target, prepared, executor, options, quiet
    )

    source_record = {"kind": scan.kind, "path": shown, "labels": options.labels, **scan.details}
    codecs = None if compression is None else compression.codecs
    manifest = job_manifest(
        options, fields, jobs, entries, source_record, job, mapped, classes=scan.classes, compression=codecs
    )
    target.commit(manifest)
    return PackResult(
        manifest=manifest,
        num_written=num_written,
        num_reused=num_reused,
        num_skipped_incomplete=scan.num_skipped_incomplete,
        num_ignored_files=scan.num_ignored_files,
        num_skipped_failed=sum(len(p.skipped) for p in mapped),
    )
