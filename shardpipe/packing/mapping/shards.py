"""A map pack's second step: the mapped outputs cut into shards, each moved into place or written anew.

The outputs of each split, in order (:meth:`Outputs.by_piece_split`; Python items:
:func:`shardpipe.packing.items.item_rows`), are cut by the greedy rule of a pack without a map
(:func:`plan_mapped_shards`), across pieces; one task writes one shard (:func:`write_mapped_shard`).
:mod:`shardpipe.packing.mapping` says why the plan has two steps.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from shardpipe.formats import bytecolumn, get_format
from shardpipe.formats.base import Format, ShardReader
from shardpipe.formats.compressor import FieldCompressor
from shardpipe.formats.layout import ShardIndex
from shardpipe.packing.mapping import check_unique_keys, fields_differ
from shardpipe.packing.mapping.pieces import MappedPiece
from shardpipe.packing.plan import cut_shards
from shardpipe.packing.shard_writing import ShardFile
from shardpipe.shardtable import ShardEntry
from shardpipe.storage import Store, local_copy


@dataclass(frozen=True, slots=True)
class Outputs:
    """Every mapped output of a job as columns, in piece order (row ``r`` of these arrays)."""

    pieces: Sequence[MappedPiece]
    keys: list[str]
    sizes: np.ndarray
    piece_of: np.ndarray
    position: np.ndarray
    """Each output's place in its piece's staged shard."""

    @classmethod
    def of(cls, pieces: Sequence[MappedPiece]) -> Outputs:
        _check_agree(pieces)
        counts = [len(p.keys) for p in pieces]
        return cls(
            pieces=pieces,
            keys=[key for p in pieces for key in p.keys],
            sizes=np.array([size for p in pieces for size in p.sizes], dtype=np.int64),
            piece_of=np.repeat(np.arange(len(pieces)), counts),
            position=np.concatenate([np.arange(n) for n in counts]) if pieces else np.zeros(0, np.int64),
        )

    @property
    def fields(self) -> tuple[str, ...]:
        return next((p.fields for p in self.pieces if p.keys), ())

    def by_piece_split(self) -> dict[str, np.ndarray]:
        """Each split's rows in piece order: a source's outputs keep their inputs' split and order."""
        splits: dict[str, np.ndarray] = {}
        for split in dict.fromkeys(p.split for p in self.pieces):
            ours = [i for i, p in enumerate(self.pieces) if p.split == split]
            splits[split] = np.flatnonzero(np.isin(self.piece_of, ours))
        return splits


@dataclass(frozen=True, slots=True)
class MappedShardJob:
    """One shard of mapped outputs: runs ``(staged shard, start, stop)`` of samples of staged shards, in
    order; a single run that is all of one staged shard moves it into place."""

    split: str
    relpath: str
    fields: tuple[str, ...]
    runs: list[tuple[ShardEntry, int, int]]

    @property
    def num_samples(self) -> int:
        return sum(stop - start for _, start, stop in self.runs)

    @property
    def whole(self) -> bool:
        """Whether the shard is exactly one staged shard."""
        return len(self.runs) == 1 and self.runs[0][1] == 0 and self.runs[0][2] == self.runs[0][0].num_samples


def plan_mapped_shards(
    outputs: Outputs,
    rows: Mapping[str, np.ndarray],
    suffix: str,
    *,
    max_samples: int | None,
    max_bytes: int | None,
) -> list[MappedShardJob]:
    """Every split's shards, in manifest order: the split's output ``rows`` in the order given, cut by the
    greedy rule of a pack without a map; each shard as runs of consecutive staged samples."""
    jobs: list[MappedShardJob] = []
    for split, ordered in rows.items():
        keys = [outputs.keys[r] for r in ordered]
        cuts = cut_shards(keys, outputs.sizes[ordered], max_samples=max_samples, max_bytes=max_bytes)
        for number, cut in enumerate(cuts if keys else []):
            shard = ordered[cut]  # (samples,) row ids
            breaks = np.flatnonzero((np.diff(shard) != 1) | (np.diff(outputs.piece_of[shard]) != 0)) + 1
            runs = []
            for part in np.split(shard, breaks):  # rows one after another, in one piece
                staged = cast(
                    ShardEntry, outputs.pieces[int(outputs.piece_of[part[0]])].staged
                )  # has outputs
                runs.append((staged, int(outputs.position[part[0]]), int(outputs.position[part[-1]]) + 1))
            jobs.append(MappedShardJob(split, f"{split}/shard-{number:06d}{suffix}", outputs.fields, runs))
    return jobs


def _check_agree(pieces: Sequence[MappedPiece]) -> None:
    with_outputs = [p for p in pieces if p.keys]
    for piece in with_outputs[1:]:
        if piece.fields != with_outputs[0].fields:
            raise fields_differ(piece.keys[0], piece.fields, with_outputs[0].keys[0], with_outputs[0].fields)
    check_unique_keys([key for piece in with_outputs for key in piece.keys])


def write_mapped_shard(
    job: MappedShardJob, out: Store, format_name: str, compressor: FieldCompressor | None = None
) -> ShardEntry:
    """Write one shard of mapped outputs: a whole staged shard is moved into place (its index first), any
    other is written from the staged samples it spans, read and checked. Module-level, its arguments
    pickle: any executor runs it. Staged samples are stored uncompressed: with a ``compressor`` every
    shard is written from them."""
    if job.whole and compressor is None:
        staged = job.runs[0][0]
        index_path = None
        if staged.index_path is not None:
            index_path = f"{job.relpath}.idx"
            out.move(staged.index_path, index_path)
        out.move(staged.path, job.relpath)
        return replace(staged, path=job.relpath, index_path=index_path)
    fmt = get_format(format_name)
    with ShardFile(job.relpath, out, format_name, job.fields, compressor=compressor) as shard:
        for staged, start, stop in job.runs:
            with staged_reader(out, staged, fmt, job.fields) as reader:
                keys, columns = reader.read_runs([(start, stop)], job.fields)
            values = [bytecolumn.values(columns[name]) for name in job.fields]
            for key, *sample in zip(keys, *values, strict=True):
                shard.add(key, sample, sum(map(len, sample)))
        return shard.finish()


def staged_samples(outputs: Outputs, out: Store, format_name: str, count: int) -> dict[str, list[bytes]]:
    """Each field's values of the first ``count`` outputs (in piece order, as staged): the sample a
    compression dictionary is trained on, the same for any worker count or engine."""
    fmt = get_format(format_name)
    found: dict[str, list[bytes]] = {name: [] for name in outputs.fields}
    left = count
    for piece in outputs.pieces:
        staged = piece.staged
        if left <= 0:
            break
        if staged is None or not staged.num_samples:
            continue
        take = min(left, staged.num_samples)
        with staged_reader(out, staged, fmt, outputs.fields) as reader:
            _, columns = reader.read_runs([(0, take)], outputs.fields)
        for name in outputs.fields:
            found[name] += [value for value in bytecolumn.values(columns[name]) if value is not None]
        left -= take
    return found


@contextmanager
def staged_reader(
    out: Store, staged: ShardEntry, fmt: Format, fields: Sequence[str]
) -> Iterator[ShardReader]:
    """A reader of a staged piece: a local copy of it, and its index checked against its sha256, while
    the block runs."""
    with local_copy(out, staged.path) as path:
        index = None
        if staged.index_path is not None:
            with local_copy(out, staged.index_path) as index_file:
                index = ShardIndex.read(index_file, staged.num_samples, fields, sha256=staged.index_sha256)
        with fmt.open_reader(path, index) as reader:
            yield reader
