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
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from shardpipe.formats import format_info
from shardpipe.formats.compression import SAMPLE_COUNT
from shardpipe.manifest import Manifest
from shardpipe.packing.compressing import Compression, plan_compression, table_samples
from shardpipe.packing.driver import PackResult, job_manifest, map_all, write_all
from shardpipe.packing.engine import local_pool
from shardpipe.packing.mapping.pieces import MappedPiece, MapPiece, plan_pieces
from shardpipe.packing.mapping.shards import Outputs, plan_mapped_shards, staged_samples, write_mapped_shard
from shardpipe.packing.options import PackOptions
from shardpipe.packing.output import Job, Output, Prepared
from shardpipe.packing.plan import ShardJob, fingerprint, plan_jobs
from shardpipe.packing.shard_writing import write_shard
from shardpipe.packing.transform import Transform
from shardpipe.process_settings import pausing_gc
from shardpipe.progress import phase
from shardpipe.shardtable import ShardEntry
from shardpipe.sources import scan_source
from shardpipe.sources.table import SampleTable, Scan
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
    scan = _scan(src, shown, options, executor, storage_options, quiet)
    suffix = format_info(options.format).suffix
    transform = options.transform()
    if options.split is None and scan.splits:
        options = replace(options, source_splits=scan.splits)
    jobs = plan_jobs(scan.table, suffix, options, scan.row_splits)
    pieces = plan_pieces(jobs, suffix) if transform is not None else []
    job = Job(fingerprint(_planned(jobs, pieces), options), options.job_options(), shown)
    prepared = target.prepare(job, resume=options.resume, overwrite=options.overwrite)
    if prepared.complete is not None:
        return _already_complete(prepared.complete, scan)

    if transform is None:
        work = _source_work(jobs, scan.table, target, options, storage_options, quiet)
    else:
        work = _mapped_work(
            pieces, transform, suffix, target, prepared, executor, options, storage_options, quiet
        )
    entries, num_written, num_reused = write_all(
        work.jobs, work.write, work.args, target, prepared, executor, options, quiet
    )

    source_record = {"kind": scan.kind, "path": shown, "labels": options.labels, **scan.details}
    codecs = None if work.compression is None else work.compression.codecs
    manifest = job_manifest(
        options,
        work.fields,
        work.jobs,
        entries,
        source_record,
        job,
        work.mapped,
        classes=scan.classes,
        compression=codecs,
    )
    target.commit(manifest)
    return PackResult(
        manifest=manifest,
        num_written=num_written,
        num_reused=num_reused,
        num_skipped_incomplete=scan.num_skipped_incomplete,
        num_ignored_files=scan.num_ignored_files,
        num_skipped_failed=sum(len(p.skipped) for p in work.mapped),
    )


@dataclass(frozen=True, slots=True)
class _ShardWork:
    """The write stage's work and what the manifest records of it: the planned shards, the task that
    writes one and its arguments, the shards' fields, the mapped pieces (none without a transform) and
    the compression (None without one)."""

    jobs: Sequence[Any]
    write: Callable[..., ShardEntry]
    args: tuple[Any, ...]
    fields: tuple[str, ...]
    mapped: list[MappedPiece]
    compression: Compression | None


def _scan(
    src: Path | str,
    shown: str,
    options: PackOptions,
    executor: Executor | None,
    storage_options: Mapping[str, Any] | None,
    quiet: bool,
) -> Scan:
    """The source listed into a table of samples, on ``executor``, under the ``scan`` phase."""
    with phase("scan", f"listing {shown}", quiet=quiet):
        return scan_source(
            src,
            labels=options.labels,
            literal_fields=options.literal_fields,
            skip_incomplete=options.skip_incomplete,
            pool=executor,
            storage_options=storage_options,
            key_column=options.key_column,
            field_map=options.field_map,
        )


def _planned(jobs: Sequence[ShardJob], pieces: Sequence[MapPiece]) -> list[tuple[str, Any]]:
    """What the job's fingerprint covers: the map pieces' samples where the job maps, else the planned
    shards' samples."""
    return [(p.relpath, p.samples) for p in pieces if p.samples is not None] or [
        (j.relpath, j.samples) for j in jobs
    ]


def _already_complete(manifest: Manifest, scan: Scan) -> PackResult:
    """The result of a resume that finds this job finished in OUT: nothing written, every shard kept."""
    return PackResult(
        manifest=manifest,
        num_written=0,
        num_reused=sum(len(shards) for shards in manifest.splits.values()),
        num_skipped_incomplete=scan.num_skipped_incomplete,
        num_ignored_files=scan.num_ignored_files,
        already_complete=True,
        num_skipped_failed=int(manifest.skipped.get("count", 0)),
    )


def _source_work(
    jobs: list[ShardJob],
    table: SampleTable,
    target: Output,
    options: PackOptions,
    storage_options: Mapping[str, Any] | None,
    quiet: bool,
) -> _ShardWork:
    """Without a transform: each planned shard is written from its source files, compressed with
    dictionaries trained on sampled source values."""
    samples = partial(table_samples, table, "the compression sample", storage_options)
    compression = _compression(options, table.fields, samples, target, quiet)
    args = _with_compressor((target.store, options.format, storage_options), compression)
    return _ShardWork(jobs, write_shard, args, table.fields, [], compression)


def _mapped_work(
    pieces: list[MapPiece],
    transform: Transform,
    suffix: str,
    target: Output,
    prepared: Prepared,
    executor: Executor | None,
    options: PackOptions,
    storage_options: Mapping[str, Any] | None,
    quiet: bool,
) -> _ShardWork:
    """With a transform: every piece is mapped and staged first, then the shards are cut from the
    outputs (:mod:`.mapping`) and written from the staged samples, compressed with dictionaries trained
    on the first staged outputs."""
    map_args = (target.store, options.format, transform, options.on_error, storage_options)
    mapped = map_all(pieces, target, prepared, executor, quiet, map_args)
    outputs = Outputs.of(mapped)
    jobs = plan_mapped_shards(
        outputs,
        outputs.by_piece_split(),
        suffix,
        max_samples=options.max_samples,
        max_bytes=options.max_bytes,
    )
    samples = partial(staged_samples, outputs, target.store, options.format, SAMPLE_COUNT)
    compression = _compression(options, outputs.fields, samples, target, quiet)
    args = _with_compressor((target.store, options.format), compression)
    return _ShardWork(jobs, write_mapped_shard, args, outputs.fields, mapped, compression)


def _compression(
    options: PackOptions,
    fields: tuple[str, ...],
    samples: Callable[[], Mapping[str, Sequence[bytes]]],
    target: Output,
    quiet: bool,
) -> Compression | None:
    """The pack's compression, None without ``compress``; ``samples`` is called only when there is
    one, because sampling values reads them."""
    spec = options.compress_spec
    if spec is None:
        return None
    with phase("compress", "sampling values and training dictionaries", quiet=quiet):
        return plan_compression(
            spec, fields, options.compress_fields, samples(), options.max_bytes, target.store
        )


def _with_compressor(args: tuple[Any, ...], compression: Compression | None) -> tuple[Any, ...]:
    """A write task's arguments, with the compressor appended only when there is one: the task's other
    callers are unchanged."""
    return args if compression is None else (*args, compression.compressor)
