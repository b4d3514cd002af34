"""``pack_items``: samples made in Python from items (ids, URLs, rows), in parallel, packed like files.

``fn(item)`` returns a sample, ``None`` or a list of samples (webdataset's dict convention), each with
its own key. It runs as a pack's map does (:mod:`.mapping`), with the same guarantees: the items are cut
into pieces by their count alone, so the shards are the same for any worker count or engine; a finished
job is a no-op and an interrupted one resumes, keeping its mapped pieces; a failing item stops the pack or
is skipped and named. What identifies the job is ``fn`` (name, source, ``options.map_version``) and the
items' pickled bytes, so ``fn`` and the items must be the same to resume.

An item has no key until ``fn`` runs: all of an item's outputs go to the split that the seeded hash of
its first output's key picks (so the outputs of one item never straddle splits), and with
``order="hashed"`` items are ordered by the same key's order hash; with ``"sorted"`` they keep the
order given.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle  # dumps only, to hash the caller's own items into the resume fingerprint: never loads
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any

import numpy as np

from shardpipe.errors import UsageError
from shardpipe.formats import format_info
from shardpipe.formats.compression import SAMPLE_COUNT
from shardpipe.packing.compressing import plan_compression
from shardpipe.packing.driver import PackResult, job_manifest, map_all, write_all
from shardpipe.packing.engine import local_pool
from shardpipe.packing.mapping.pieces import MapPiece, staged_path
from shardpipe.packing.mapping.shards import Outputs, plan_mapped_shards, staged_samples, write_mapped_shard
from shardpipe.packing.options import PackOptions
from shardpipe.packing.output import Job, Output
from shardpipe.packing.plan import hashed_order
from shardpipe.packing.split import assign_splits
from shardpipe.process_settings import pausing_gc
from shardpipe.storage import as_location, open_writable_store

TARGET_PIECES = 64
"""Items are cut into about this many pieces (at most ``MAX_PIECE_ITEMS`` items each, at least one):
enough to spread a costly function over many workers, whatever their number."""
MAX_PIECE_ITEMS = 4096


def pack_items(
    items: Sequence[Any],
    fn: Callable[[Any], Any] | str,
    out: str | os.PathLike[str],
    options: PackOptions,
    *,
    quiet: bool = False,
    executor: Executor | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> PackResult:
    """Map ``fn`` over ``items`` on ``executor`` (a local pool of ``options.workers`` by default) and pack
    the samples it returns into ``out``. ``options`` as for :func:`~shardpipe.packing.pack`, except those
    that describe a source (``labels``, ``literal_fields``, ``skip_incomplete``) and ``map`` (``fn``
    is it)."""
    if options.map is not None:
        raise UsageError("pack_items maps fn over the items: options.map must be None")
    for name in ("labels", "skip_incomplete"):
        if getattr(options, name):
            raise UsageError(f"{name} describes a source of files; pack_items has items instead")
    if options.literal_fields:
        raise UsageError("literal_fields describes a file list; pack_items has items instead")
    options = replace(options, map=fn)
    with pausing_gc():
        if executor is not None:
            return _pack_items(list(items), out, options, quiet, executor, storage_options)
        with local_pool(options.num_workers) as pool:
            return _pack_items(list(items), out, options, quiet, pool, storage_options)


def _pack_items(
    items: list[Any],
    out: str | os.PathLike[str],
    options: PackOptions,
    quiet: bool,
    executor: Executor | None,
    storage_options: Mapping[str, Any] | None,
) -> PackResult:
    target = Output(open_writable_store(as_location(out), storage_options=storage_options, action="pack to"))
    transform = options.transform()
    if transform is None:
        raise UsageError("pack_items needs a function fn(item) -> sample(s)")
    suffix = format_info(options.format).suffix
    pieces = plan_item_pieces(items, suffix)
    job = Job(items_fingerprint(pieces, options), options.job_options(), "python items")
    prepared = target.prepare(job, resume=options.resume, overwrite=options.overwrite)
    if prepared.complete is not None:
        return PackResult(
            manifest=prepared.complete,
            num_written=0,
            num_reused=sum(len(shards) for shards in prepared.complete.splits.values()),
            num_skipped_incomplete=0,
            num_ignored_files=0,
            already_complete=True,
            num_skipped_failed=int(prepared.complete.skipped.get("count", 0)),
        )
    map_args = (target.store, options.format, transform, options.on_error, storage_options)
    mapped = map_all(pieces, target, prepared, executor, quiet, map_args)
    outputs = Outputs.of(mapped)
    jobs = plan_mapped_shards(
        outputs,
        item_rows(outputs, options),
        suffix,
        max_samples=options.max_samples,
        max_bytes=options.max_bytes,
    )
    compression = None
    if (spec := options.compress_spec) is not None:
        samples = staged_samples(outputs, target.store, options.format, SAMPLE_COUNT)
        compression = plan_compression(
            spec, outputs.fields, options.compress_fields, samples, options.max_bytes, target.store
        )
    args: tuple[Any, ...] = (target.store, options.format)
    if compression is not None:
        args += (compression.compressor,)
    entries, num_written, num_reused = write_all(
        jobs, write_mapped_shard, args, target, prepared, executor, options, quiet
    )
    source = {"kind": "items", "count": len(items)}
    codecs = None if compression is None else compression.codecs
    manifest = job_manifest(options, outputs.fields, jobs, entries, source, job, mapped, compression=codecs)
    target.commit(manifest)
    return PackResult(
        manifest=manifest,
        num_written=num_written,
        num_reused=num_reused,
        num_skipped_incomplete=0,
        num_ignored_files=0,
        num_skipped_failed=sum(len(p.skipped) for p in mapped),
    )


def plan_item_pieces(items: Sequence[Any], suffix: str) -> list[MapPiece]:
    """The items as about ``TARGET_PIECES`` pieces of consecutive items (a function of their count)."""
    size = min(MAX_PIECE_ITEMS, max(1, math.ceil(len(items) / TARGET_PIECES)))
    return [
        MapPiece(
            "", index, staged_path(index, suffix), items=tuple(items[start : start + size]), first_item=start
        )
        for index, start in enumerate(range(0, len(items), size))
    ]


def items_fingerprint(pieces: Sequence[MapPiece], options: PackOptions) -> str:
    """The job's options, ``fn``'s identity (among them) and the items' pickled bytes."""
    digest = hashlib.sha256(json.dumps(options.job_options(), sort_keys=True).encode())
    for piece in pieces:
        digest.update(pickle.dumps((piece.index, piece.items), protocol=4))
    return digest.hexdigest()[:16]


def item_rows(outputs: Outputs, options: PackOptions) -> dict[str, np.ndarray]:
    """Each split's output rows: every item's outputs together, in the split and the place the key of its
    first output picks (its order hash with ``order="hashed"``, the items' order with ``"sorted"``)."""
    counts = np.array([n for piece in outputs.pieces for n in piece.groups], dtype=np.int64)
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)[counts > 0]  # row of each group
    counts = counts[counts > 0]
    first_keys = [outputs.keys[row] for row in firsts]
    order = hashed_order(first_keys, options.seed) if options.order == "hashed" else list(range(len(firsts)))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    rows: dict[str, np.ndarray] = {}
    for split, groups in assign_splits(first_keys, options.split_fractions, options.seed).items():
        ordered = sorted(groups, key=lambda g: rank[g])
        parts = [np.arange(firsts[g], firsts[g] + counts[g]) for g in ordered]
        rows[split] = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return rows
