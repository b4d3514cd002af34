"""The driver's side of a pack, shared by :func:`~shardpipe.packing.pack` and
:func:`~shardpipe.packing.items.pack_items`: run the planned tasks on the engine, journal each result as
it completes, keep what a resume finds intact, and make the manifest of the finished job.

Only the driver writes the journal and the manifest (:mod:`.engine`); tasks return values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from shardpipe.formats.compression import FieldCodec
from shardpipe.manifest import Manifest
from shardpipe.packing import tally
from shardpipe.packing.engine import run_tasks
from shardpipe.packing.mapping.pieces import MappedPiece, map_piece, skipped_record
from shardpipe.packing.options import PackOptions
from shardpipe.packing.output import Job, Output, Prepared
from shardpipe.progress import Progress
from shardpipe.shardtable import ShardEntry, ShardTable


@dataclass(frozen=True, slots=True)
class PackResult:
    """What a pack did: the manifest it committed, the shards it wrote and kept, the inputs it left out."""

    manifest: Manifest
    num_written: int
    num_reused: int
    num_skipped_incomplete: int
    num_ignored_files: int
    already_complete: bool = False
    """True when ``resume`` found this job already finished in OUT: nothing was written."""
    num_skipped_failed: int = 0
    """Inputs a transform failed on, left out under ``on_error="skip"`` (named in the manifest)."""


def job_manifest(
    options: PackOptions,
    fields: tuple[str, ...],
    jobs: Sequence[Any],
    entries: Sequence[ShardEntry],
    source: dict[str, Any],
    job: Job,
    mapped: Sequence[MappedPiece],
    *,
    classes: tuple[str, ...] | None = None,
    compression: dict[str, FieldCodec] | None = None,
) -> Manifest:
    """The manifest of a finished job: its shards by split in plan order, and every rule it followed."""
    splits = {
        name: ShardTable.of(e for j, e in zip(jobs, entries, strict=True) if j.split == name)
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
        compression=compression or {},
    )


def map_all(
    pieces: Sequence[Any],
    target: Output,
    prepared: Prepared,
    executor: Executor | None,
    quiet: bool,
    args: tuple[Any, ...],
) -> list[MappedPiece]:
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
    jobs: Sequence[Any],
    task: Callable[..., ShardEntry],
    args: tuple[Any, ...],
    target: Output,
    prepared: Prepared,
    executor: Executor | None,
    options: PackOptions,
    quiet: bool,
) -> tuple[list[ShardEntry], int, int]:
    """Every planned shard written (journaled ones kept when still intact); the entries in plan order,
    and how many were written and kept."""
    reused = {j.relpath: e for j in jobs if (e := target.reusable(prepared.finished.get(j.relpath)))}
    progress = Progress(f"pack {options.format}", sum(_num_samples(j) for j in jobs), quiet=quiet)
    reused_samples = sum(e.num_samples for e in reused.values())
    reused_bytes = sum(e.num_bytes for e in reused.values())
    finished = [reused_samples, reused_bytes]  # in the shards done, reused or written
    live = tally.current()  # what the local writers have written so far, unfinished shards included
    start = live.read() if live is not None else (0, 0)

    def refresh() -> None:
        samples, num_bytes = live.read() if live is not None else start
        progress.advance_to(
            max(finished[0], reused_samples + samples - start[0]),
            max(finished[1], reused_bytes + num_bytes - start[1]),
        )

    written: dict[str, ShardEntry] = {}
    if live is not None:
        live.listener = refresh  # shards written in this process report as they go
    try:
        todo = [j for j in jobs if j.relpath not in reused]
        for entry in run_tasks(task, todo, args, executor, waiting=refresh):
            target.record(entry)
            written[entry.path] = entry
            finished[0] += entry.num_samples
            finished[1] += entry.num_bytes
            refresh()
    finally:
        if live is not None:
            live.listener = None
    progress.close()
    entries = {**reused, **written}
    return [entries[j.relpath] for j in jobs], len(written), len(reused)


def _num_samples(job: Any) -> int:
    return job.num_samples if hasattr(job, "num_samples") else len(job.samples)
