"""``pack``: source -> split -> plan -> (map) -> write -> manifest.

The flow: scan the source (:mod:`shardpipe.sources`), plan the work once (:mod:`.plan`: split, order,
cuts, the job fingerprint), make OUT ready (:mod:`.output`: journal, resume, overwrite), do the work not
already done on an engine (:mod:`.engine`), then commit the manifest last and remove the journal. SRC and
OUT may each be a local path or a URL: every step goes through the storage seam.

Without a transform, each task writes one planned shard from its source files (:mod:`.write`). With a
map or the image preparation, tasks first map pieces of the inputs, then write shards of the outputs
(:mod:`.mapping`, which says why the cut stays a pure function of the ordered outputs).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any

from shardpipe.formats import format_info
from shardpipe.manifest import Manifest, ShardEntry
from shardpipe.packing.engine import local_pool, run_tasks
from shardpipe.packing.mapping import (
    MappedPiece,
    Outputs,
    map_piece,
    plan_mapped_shards,
    plan_pieces,
    skipped_record,
    write_mapped_shard,
)
from shardpipe.packing.options import PackOptions
from shardpipe.packing.output import Job, Output, Prepared
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
    num_skipped_failed: int = 0
    """Inputs a transform failed on, left out under ``on_error="skip"`` (named in the manifest)."""


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
    if options.split is None and scan.splits:
        options = replace(options, source_splits=scan.splits)
    suffix = format_info(options.format).suffix
    transform = options.transform()
    jobs = plan_jobs(scan.table, suffix, options, scan.row_splits)
    pieces = plan_pieces(jobs, suffix) if transform is not None else []
    source = redact_url(str(src)) if isinstance(src, str) else os.fspath(src)  # never a credential
    planned = [(p.relpath, p.samples) for p in pieces if p.samples is not None] or [
        (j.relpath, j.samples) for j in jobs
    ]
    job = Job(fingerprint(planned, options), options.job_options(), source)
    prepared = target.prepare(job, resume=options.resume, overwrite=options.overwrite)
    counts = (scan.num_skipped_incomplete, scan.num_ignored_files)
    if prepared.complete is not None:
        num_shards = sum(len(shards) for shards in prepared.complete.splits.values())
        skipped = int(prepared.complete.skipped.get("count", 0))
        return PackResult(prepared.complete, 0, num_shards, *counts, True, skipped)

    mapped: list[MappedPiece] = []
    fields = scan.table.fields
    if transform is None:
        write: Callable[..., ShardEntry] = write_shard
        args: tuple[Any, ...] = (target.store, options.format, storage_options)
    else:
        map_args = (target.store, options.format, transform, options.on_error, storage_options)
        mapped = map_all(pieces, target, prepared, executor, quiet, map_args)
        outputs = Outputs.of(mapped)
        fields = outputs.fields
        jobs = plan_mapped_shards(  # type: ignore[assignment]
            outputs, outputs.by_piece_split(), suffix, max_samples=options.max_samples,
            max_bytes=options.max_bytes,
        )  # fmt: skip
        write, args = write_mapped_shard, (target.store, options.format)
    entries, num_written, num_reused = write_all(
        jobs, write, args, target, prepared, executor, options, quiet
    )

    source_record = {"kind": scan.kind, "path": source, "labels": options.labels, **scan.details}
    manifest = job_manifest(options, fields, jobs, entries, source_record, job, mapped, classes=scan.classes)
    target.commit(manifest)
    return PackResult(manifest, num_written, num_reused, *counts, False, sum(len(p.skipped) for p in mapped))


def job_manifest(
    options: PackOptions, fields: tuple[str, ...], jobs: Sequence[Any], entries: Sequence[ShardEntry],
    source: dict[str, Any], job: Job, mapped: Sequence[MappedPiece],
    *, classes: tuple[str, ...] | None = None,
) -> Manifest:  # fmt: skip
    """The manifest of a finished job: its shards by split in plan order, and every rule it followed."""
    splits = {
        name: tuple(e for j, e in zip(jobs, entries, strict=True) if j.split == name)
        for name in options.split_names
    }
    return Manifest(
        format=options.format,
        fields=fields,
        classes=classes,
        splits=splits,
        source=source,
        split_rule=options.split_rule(),
        shard_limits=options.shard_limits(),
        order=options.order_rule(),
        job=job.to_json(),
        skipped=skipped_record(mapped),
    )


def map_all(
    pieces: Sequence[Any], target: Output, prepared: Prepared, executor: Executor | None, quiet: bool,
    args: tuple[Any, ...],
) -> list[MappedPiece]:  # fmt: skip
    """Every piece mapped and staged (journaled ones kept when still intact), in plan order."""
    done = {p.index: kept for p in pieces if (kept := target.reusable_piece(prepared.pieces.get(p.index)))}
    progress = Progress("map", sum(len(p) for p in pieces), quiet=quiet)
    outputs = 0

    def count(piece: MappedPiece) -> None:
        nonlocal outputs
        outputs += len(piece.keys)
        progress.update(piece.num_inputs, sum(piece.sizes), note=f"{outputs:,} out")

    for piece in done.values():
        count(piece)
    for piece in run_tasks(map_piece, [p for p in pieces if p.index not in done], args, executor):
        target.record(piece)
        done[piece.index] = piece
        count(piece)
    progress.close()
    return [done[p.index] for p in pieces]


def write_all(
    jobs: Sequence[Any], task: Callable[..., ShardEntry], args: tuple[Any, ...], target: Output,
    prepared: Prepared, executor: Executor | None, options: PackOptions, quiet: bool,
) -> tuple[list[ShardEntry], int, int]:  # fmt: skip
    """Every planned shard written (journaled ones kept when still intact); the entries in plan order,
    and how many were written and kept."""
    reused = {j.relpath: e for j in jobs if (e := target.reusable(prepared.finished.get(j.relpath)))}
    progress = Progress(f"pack {options.format}", sum(_num_samples(j) for j in jobs), quiet=quiet)
    progress.update(sum(e.num_samples for e in reused.values()), sum(e.num_bytes for e in reused.values()))
    written: dict[str, ShardEntry] = {}
    for entry in run_tasks(task, [j for j in jobs if j.relpath not in reused], args, executor):
        target.record(entry)
        written[entry.path] = entry
        progress.update(entry.num_samples, entry.num_bytes)
    progress.close()
    entries = {**reused, **written}
    return [entries[j.relpath] for j in jobs], len(written), len(reused)


def _num_samples(job: Any) -> int:
    return job.num_samples if hasattr(job, "num_samples") else len(job.samples)
