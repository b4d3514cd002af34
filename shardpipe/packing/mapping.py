"""Packing with a transform (a user map, the image preparation: :mod:`.transform`): its two steps.

The plan with a transform has two steps, so that the cut of shards stays a pure function of the ordered
outputs whatever runs the work:

1. **Pieces.** The inputs, in plan order, are cut into pieces of at most :data:`PIECE_SAMPLES` inputs
   (and, for files, :data:`PIECE_BYTES`): a pure function of the inputs, never of the worker count. One
   task maps one piece in order (:func:`map_piece`) and stages its checked outputs, framed as LMDB
   records are (:mod:`shardpipe.formats.framing`: key, fields, checksum), as one object under
   ``OUT/.shardpipe-staging/``; its result (:class:`MappedPiece`: each output's key and sizes) is
   journaled, so a resume keeps finished pieces.
2. **Shards.** The outputs of each split, in order, are cut into shards by the same greedy rule as inputs
   without a map (``max_samples``, ``max_bytes`` of payload), across pieces; one task writes one shard
   from the staged records it spans (:func:`write_mapped_shard`). The staging objects go once the
   manifest is in place.

For a source (files), the inputs are split and ordered before the map, and their outputs keep that
split and order: a map whose outputs equal its inputs writes the same shards, byte for byte, as no map.
Inputs given in Python (:func:`shardpipe.packing.items.pack_items`) have no key until mapped: each one's
outputs go to the split (and the place in the order) that the key of its first output picks.

A failing input stops the pack naming it, its source files and the function's error, unless
``on_error="skip"``: then it is left out, counted and named (with a one-line error) in the manifest.
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
"""Skipped inputs named one by one in the manifest; the count covers them all."""


class MapError(DataError):
    """The map failed on an input (and ``on_error`` is ``raise``), or its outputs disagree; the message
    names the input, its source files and the function's own error."""

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, slots=True)
class MapPiece:
    """One piece of the inputs, mapped in order by one task: samples of a source, or Python items."""

    split: str
    """The split of a source's samples; empty for items (decided by their outputs' keys)."""
    index: int
    """The piece's number in the job (every split's pieces, in plan order)."""
    samples: SampleTable | None = None
    items: tuple[Any, ...] = ()
    first_item: int = 0
    """The position of ``items[0]`` among all items, for messages."""

    @property
    def relpath(self) -> str:
        """The staged object of its outputs, under OUT."""
        return f"{STAGING}/piece-{self.index:06d}.rec"

    def __len__(self) -> int:
        return len(self.samples) if self.samples is not None else len(self.items)

    def inputs(self, source_options: Mapping[str, Any] | None) -> Iterator[tuple[Any, str, str]]:
        """``(what the map takes, the input's name, where it came from)`` for each input in order."""
        if self.samples is None:
            for offset, item in enumerate(self.items):
                yield item, f"item {self.first_item + offset}", f"{item!r:.80}"
            return
        table = self.samples
        cells = [[c for c in row if isinstance(c, str)] for row in zip(*table.columns, strict=True)]
        position = 0
        for keys, names, columns in load_batches(table, self.relpath, source_options):
            for i, key in enumerate(keys):
                sample: Sample = {KEY: key}
                for name, column in zip(names, columns, strict=True):
                    sample[name] = bytes(column[i])  # a copy: the read buffer is reused
                yield sample, key, ", ".join(cells[position]) or "literal values"
                position += 1


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
    groups: list[int]
    """How many outputs each input gave, in input order (0 for a dropped or skipped one)."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """``(input name, one-line error)`` of every input left out under ``on_error="skip"``."""

    def to_json(self) -> dict[str, Any]:
        return {"piece": {**asdict(self), "fields": list(self.fields)}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MappedPiece:
        piece = dict(data["piece"])
        piece["fields"] = tuple(piece["fields"])
        piece["skipped"] = [tuple(pair) for pair in piece["skipped"]]
        return cls(**piece)


def plan_pieces(splits: Mapping[str, SampleTable]) -> list[MapPiece]:
    """Every split's samples (in plan order) as pieces of at most ``PIECE_SAMPLES`` inputs and
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
    groups: list[int] = []
    skipped: list[tuple[str, str]] = []
    fields: tuple[str, ...] | None = None
    apply = transform.bind()
    for given, name, where in piece.inputs(source_options):
        try:
            outputs = apply(given)
        except Exception as exc:  # the user's function: any error is this input's
            line = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            if on_error == "skip":
                skipped.append((name, line))
                groups.append(0)
                continue
            label = name if piece.samples is None else f"sample {name!r}"
            raise MapError(f"the map failed on {label} ({where}): {line}", key=name) from exc
        for key, output in outputs:
            names = tuple(sorted(output))
            if fields is None:
                fields = names
            elif names != fields:
                raise _fields_differ(key, names, keys[0], fields)
            keys.append(key)
            sizes.append(sum(map(len, output.values())))
            records.append(framing.encode(key, output))
        groups.append(len(outputs))
    _check_unique(keys)
    data = b"".join(records)
    sha256 = out.put(piece.relpath, data, durable=False)
    return MappedPiece(piece.split, piece.index, piece.relpath, sha256, len(data), len(piece), fields or (),
                       keys, sizes, list(map(len, records)), groups, skipped)  # fmt: skip


def skipped_record(pieces: Sequence[MappedPiece]) -> dict[str, Any]:
    """What the manifest records of the inputs left out: their count, and the first ones by name."""
    failed = [{"key": key, "error": error} for piece in pieces for key, error in piece.skipped]
    return {"count": len(failed), "samples": failed[:MAX_SKIPPED_NAMED]} if failed else {}


@dataclass(frozen=True, slots=True)
class Outputs:
    """Every mapped output of a job as columns, in piece order (row ``r`` of these arrays)."""

    pieces: Sequence[MappedPiece]
    keys: list[str]
    sizes: np.ndarray
    piece_of: np.ndarray
    start: np.ndarray
    """Each record's first byte in its piece's staged object."""
    length: np.ndarray

    @classmethod
    def of(cls, pieces: Sequence[MappedPiece]) -> Outputs:
        _check_agree(pieces)
        lengths = [np.array(p.lengths, dtype=np.int64) for p in pieces]
        return cls(
            pieces,
            [key for p in pieces for key in p.keys],
            np.array([size for p in pieces for size in p.sizes], dtype=np.int64),
            np.repeat(np.arange(len(pieces)), [len(p.keys) for p in pieces]),
            np.concatenate([np.cumsum(n) - n for n in lengths]) if pieces else np.zeros(0, np.int64),
            np.concatenate(lengths) if pieces else np.zeros(0, np.int64),
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
    outputs: Outputs,
    rows: Mapping[str, np.ndarray],
    suffix: str,
    *,
    max_samples: int | None,
    max_bytes: int | None,
) -> list[MappedShardJob]:
    """Every split's shards, in manifest order: the split's output ``rows`` in the order given, cut by the
    greedy rule of a pack without a map; each shard as runs of consecutive staged records."""
    jobs: list[MappedShardJob] = []
    for split, ordered in rows.items():
        keys = [outputs.keys[r] for r in ordered]
        runs = cut_shards(keys, outputs.sizes[ordered], max_samples=max_samples, max_bytes=max_bytes)
        for number, run in enumerate(runs if keys else []):
            shard = ordered[run]  # (samples,) row ids
            breaks = np.flatnonzero(np.diff(shard) != 1) + 1  # a run of rows one after another...
            breaks = np.union1d(
                breaks, np.flatnonzero(np.diff(outputs.piece_of[shard]) != 0) + 1
            )  # ...in one piece
            segments = []
            for part in np.split(shard, breaks):
                first, last = int(part[0]), int(part[-1])
                stop = int(outputs.start[last] + outputs.length[last])
                segments.append((outputs.pieces[int(outputs.piece_of[first])].path, int(outputs.start[first]),
                                 stop, outputs.length[part].tolist()))  # fmt: skip
            jobs.append(
                MappedShardJob(split, f"{split}/shard-{number:06d}{suffix}", outputs.fields, segments)
            )
    return jobs


def _check_agree(pieces: Sequence[MappedPiece]) -> None:
    with_outputs = [p for p in pieces if p.keys]
    for piece in with_outputs[1:]:
        if piece.fields != with_outputs[0].fields:
            raise _fields_differ(piece.keys[0], piece.fields, with_outputs[0].keys[0], with_outputs[0].fields)
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
