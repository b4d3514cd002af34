"""Packing with a transform (a user map, the image preparation: :mod:`.transform`): its two steps.

The plan with a transform has two steps, so that the cut of shards stays a pure function of the ordered
outputs whatever runs the work:

1. **Pieces.** A split's inputs, in plan order, are cut into pieces of at most :data:`PIECE_SAMPLES`
   inputs and :data:`PIECE_BYTES` input bytes (a pure function of the inputs: never of the worker count).
   One task maps one piece in order (:func:`map_piece`) and stages its outputs, framed as LMDB records
   are (:mod:`shardpipe.formats.framing`: key, fields, checksum), as one object under
   ``OUT/.shardpipe-staging/``; its result (:class:`MappedPiece`: each output's key and sizes) is
   journaled, so a resume keeps finished pieces.
2. **Shards.** The outputs of a split, in piece order, are cut into shards by the same greedy rule as
   inputs without a map (``max_samples``, ``max_bytes`` of payload), across pieces; one task writes one
   shard from the staged records it spans (:func:`write_mapped_shard`). The staging objects go once the
   manifest is in place.

A map whose outputs equal its inputs therefore writes the same shards, byte for byte, as no map. A
failing sample stops the pack with its key, its source files and the function's error, unless
``on_error="skip"``: then it is left out, counted and named (key and one-line error) in the manifest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shardpipe.errors import DataError
from shardpipe.formats import bytecolumn, framing
from shardpipe.manifest import ShardEntry
from shardpipe.packing.plan import cut_runs, cut_shards
from shardpipe.packing.samples import KEY, Sample
from shardpipe.packing.transform import OnError, Transform
from shardpipe.packing.write import Batch, load_batches, write_columns
from shardpipe.sources import SampleTable
from shardpipe.storage import Store, task_store

STAGING = ".shardpipe-staging"
"""Where a pack with a map stages its mapped pieces, under OUT; removed once the manifest is in place."""
PIECE_SAMPLES = 4096
"""Most inputs per mapped piece: small enough to spread a costly map over the workers and to hold one
piece's outputs in memory, large enough that a task's fixed cost is small beside its samples."""
PIECE_BYTES = 8 << 20
"""Most input bytes per mapped piece (a single larger input gets a piece of its own)."""
MAX_SKIPPED_NAMED = 100
"""Skipped samples named one by one in the manifest; the count covers them all."""


class MapError(DataError):
    """The map failed on a sample (and ``on_error`` is ``raise``); the message names the sample, its
    source files and the function's own error."""

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, slots=True)
class MapPiece:
    """One piece of a split's inputs, mapped in order by one task."""

    split: str
    index: int
    """The piece's number in the job (every split's pieces, in plan order)."""
    samples: SampleTable

    @property
    def relpath(self) -> str:
        """The staged object of its outputs, under OUT."""
        return f"{STAGING}/piece-{self.index:06d}.rec"


@dataclass(frozen=True, slots=True)
class MappedPiece:
    """A piece's staged outputs, in order: what the shard plan needs, and what the journal keeps."""

    split: str
    index: int
    path: str
    sha256: str
    num_bytes: int
    num_inputs: int
    fields: tuple[str, ...]
    """The outputs' field names, sorted (every output of a dataset has the same)."""
    keys: list[str]
    sizes: list[int]
    """Each output's payload bytes (its fields), which the shard cut counts."""
    lengths: list[int]
    """Each output's framed record bytes in the staged object."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """``(input key, one-line error)`` of every input left out under ``on_error="skip"``."""

    def to_json(self) -> dict[str, Any]:
        return {"piece": {**asdict(self), "fields": list(self.fields)}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MappedPiece:
        piece = dict(data["piece"])
        piece["fields"] = tuple(piece["fields"])
        piece["skipped"] = [tuple(pair) for pair in piece["skipped"]]
        return cls(**piece)


def plan_pieces(splits: Mapping[str, SampleTable]) -> list[MapPiece]:
    """Every split's inputs (in plan order) as pieces of at most ``PIECE_SAMPLES`` inputs and
    ``PIECE_BYTES``, numbered through the job."""
    pieces: list[MapPiece] = []
    for split, samples in splits.items():
        runs = cut_runs(samples.num_bytes, max_samples=PIECE_SAMPLES, max_bytes=PIECE_BYTES)
        pieces += [MapPiece(split, len(pieces) + i, samples.take(run)) for i, run in enumerate(runs)]
    return pieces


def map_piece(
    piece: MapPiece,
    out: Store,
    transform: Transform,
    on_error: OnError = "raise",
    source_options: Mapping[str, Any] | None = None,
) -> MappedPiece:
    """Map one piece's inputs in order, check every output, stage them framed in one object of ``out``.

    Module-level, its arguments pickle: any executor runs it, and its result depends on them only."""
    out = task_store(out)
    keys: list[str] = []
    sizes: list[int] = []
    records: list[bytes] = []
    skipped: list[tuple[str, str]] = []
    fields: tuple[str, ...] | None = None
    apply = transform.bind()
    for sample, cells in _samples(piece, source_options):
        try:
            outputs = apply(sample)
        except Exception as exc:  # the user's function: any error is this sample's
            line = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            if on_error == "skip":
                skipped.append((sample[KEY], line))
                continue
            where = ", ".join(cells) or "literal values"
            raise MapError(
                f"the map failed on sample {sample[KEY]!r} ({where}): {line}", key=sample[KEY]
            ) from exc
        for key, output in outputs:
            names = tuple(sorted(output))
            if fields is None:
                fields = names
            elif names != fields:
                raise _fields_differ(key, names, keys[0], fields)
            keys.append(key)
            sizes.append(sum(map(len, output.values())))
            records.append(framing.encode(key, output))
    _check_unique(keys)
    data = b"".join(records)
    sha256 = out.put(piece.relpath, data, durable=False)
    return MappedPiece(piece.split, piece.index, piece.relpath, sha256, len(data), len(piece.samples),
                       fields or (), keys, sizes, list(map(len, records)), skipped)  # fmt: skip


def _samples(piece: MapPiece, source_options: Mapping[str, Any] | None) -> Iterator[tuple[Sample, list[str]]]:
    """Each input as a sample dict (its values copied out of the reused read buffer) and its files."""
    table = piece.samples
    cells = [[c for c in row if isinstance(c, str)] for row in zip(*table.columns, strict=True)]
    position = 0
    for keys, names, columns in load_batches(table, piece.relpath, source_options):
        for i, key in enumerate(keys):
            sample: Sample = {KEY: key}
            for name, column in zip(names, columns, strict=True):
                sample[name] = bytes(column[i])
            yield sample, cells[position]
            position += 1


def skipped_record(pieces: Sequence[MappedPiece]) -> dict[str, Any]:
    """What the manifest records of the inputs left out: their count, and the first ones by name."""
    failed = [{"key": key, "error": error} for piece in pieces for key, error in piece.skipped]
    return {"count": len(failed), "samples": failed[:MAX_SKIPPED_NAMED]} if failed else {}


@dataclass(frozen=True, slots=True)
class MappedShardJob:
    """One shard of mapped outputs: runs ``(piece object, first record byte, stop byte, record lengths)``
    of staged records, in order."""

    split: str
    relpath: str
    fields: tuple[str, ...]
    segments: list[tuple[str, int, int, list[int]]]

    @property
    def num_samples(self) -> int:
        return sum(len(lengths) for *_, lengths in self.segments)


def plan_mapped_shards(
    pieces: Sequence[MappedPiece], suffix: str, *, max_samples: int | None, max_bytes: int | None
) -> list[MappedShardJob]:
    """Every split's shards of mapped outputs, in manifest order: the outputs of a split in piece order,
    cut by the greedy rule of a pack without a map. Checks that keys are unique and fields agree."""
    _check_agree(pieces)
    jobs: list[MappedShardJob] = []
    fields = next((p.fields for p in pieces if p.keys), ())
    for split in dict.fromkeys(p.split for p in pieces):
        ours = [p for p in pieces if p.split == split and p.keys]
        keys = [key for p in ours for key in p.keys]
        sizes = np.array([size for p in ours for size in p.sizes], dtype=np.int64)
        # (piece, record) of each output in split order, and each record's start in its staged object
        which = np.repeat(np.arange(len(ours)), [len(p.keys) for p in ours])
        starts = np.concatenate([np.cumsum([0, *p.lengths[:-1]]) for p in ours]) if ours else np.zeros(0)
        lengths = [length for p in ours for length in p.lengths]
        runs = cut_shards(keys, sizes, max_samples=max_samples, max_bytes=max_bytes) if keys else []
        for number, run in enumerate(runs):
            segments = []
            for k in np.unique(which[run]):
                rows = np.flatnonzero(which[run] == k) + run.start
                first, last = int(rows[0]), int(rows[-1])
                stop = int(starts[last]) + lengths[last]
                segments.append((ours[k].path, int(starts[first]), stop, lengths[first : last + 1]))
            jobs.append(MappedShardJob(split, f"{split}/shard-{number:06d}{suffix}", fields, segments))
    return jobs


def _check_agree(pieces: Sequence[MappedPiece]) -> None:
    with_outputs = [p for p in pieces if p.keys]
    first = with_outputs[0] if with_outputs else None
    for piece in with_outputs[1:]:
        if first is not None and piece.fields != first.fields:
            raise _fields_differ(piece.keys[0], piece.fields, first.keys[0], first.fields)
    _check_unique([key for piece in with_outputs for key in piece.keys])


def _fields_differ(key: str, fields: Sequence[str], other: str, others: Sequence[str]) -> MapError:
    message = (
        f"the map returned fields {', '.join(fields)} for {key!r} but {', '.join(others)} for {other!r}; "
        "every sample must have the same fields"
    )
    return MapError(message, key=key)


def _check_unique(keys: Sequence[str]) -> None:
    if len(set(keys)) == len(keys):
        return
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise MapError(f"the map returned the key {key!r} twice; keys must be unique", key=key)
        seen.add(key)


def write_mapped_shard(job: MappedShardJob, out: Store, format_name: str) -> ShardEntry:
    """Write one shard of mapped outputs from the staged records it spans (each checked as it is
    decoded). Module-level, its arguments pickle: any executor runs it."""
    out = task_store(out)
    return write_columns(job.relpath, out, format_name, _staged(job, out))


def _staged(job: MappedShardJob, out: Store) -> Iterator[Batch]:
    for key, start, stop, lengths in job.segments:
        (data,) = out.read_ranges(key, [(start, stop)])
        keys, columns = framing.decode_joined(data, lengths, job.fields, version=framing.VERSION, check=True)
        # every output has every field (map_piece checked): no value is None
        yield keys, job.fields, [bytecolumn.values(columns[name]) for name in job.fields]  # type: ignore[misc]
