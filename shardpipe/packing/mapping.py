"""Packing with a transform (a user map, the image preparation: :mod:`.transform`): its two steps.

The sizes of a map's outputs are unknown until it has run, so the plan has two steps, and the cut of
shards stays a pure function of the ordered outputs whatever runs the work:

1. **Pieces.** The inputs are cut into pieces by the pack's own shard plan (the shards a pack without a
   map would write), each split in equal parts when the job would have fewer than :data:`MIN_PIECES`
   (so a costly map still spreads over several workers): a function of the inputs and options, never of
   the worker count. One task maps one piece in order (:func:`map_piece`), checks every output and
   writes the outputs, in the dataset's format, as a staged shard under ``OUT/.shardpipe-staging/``;
   its result (:class:`MappedPiece`: each output's key and size, the staged shard's entry) is journaled,
   so a resume keeps finished pieces.
2. **Shards.** The outputs of each split, in order, are cut into shards by the rule a pack without a map
   uses (``max_samples``, ``max_bytes`` of payload), across pieces. A shard that holds exactly one
   piece's outputs is that piece's staged shard, moved into place (no byte written twice: a map that
   keeps sizes, such as one that changes no sample, costs only itself); any other is written from the
   staged shards it spans, read and checked like any shard (:func:`write_mapped_shard`). Either way its
   bytes are the same: writers get the same batches (:meth:`~shardpipe.packing.write.ShardFile.add`).
   What is left staged goes once the manifest is in place.

For a source (files), the inputs are split and ordered before the map, and their outputs keep that
split and order: a map whose outputs equal its inputs writes the shards of no map, byte for byte.
Inputs given in Python (:mod:`.items`) have no key until mapped: each one's outputs go to the split (and
the place in the order) that the key of its first output picks.

A failing input stops the pack naming it, its source files and the function's error, unless
``on_error="skip"``: then it is left out, counted and named (with a one-line error) in the manifest.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from shardpipe.errors import DataError
from shardpipe.formats import bytecolumn, get_format
from shardpipe.formats.layout import ShardIndex
from shardpipe.manifest import ShardEntry
from shardpipe.packing.plan import cut_shards
from shardpipe.packing.samples import KEY
from shardpipe.packing.transform import OnError, Transform
from shardpipe.packing.write import ShardFile, load_batches
from shardpipe.sources import SampleTable
from shardpipe.storage import Store, local_copy, task_store

STAGING = ".shardpipe-staging"
"""Where a pack with a map stages its mapped pieces, under OUT; removed once the manifest is in place."""
MIN_PIECES = 8
"""A job planned into fewer shards is mapped in at least this many pieces (more shards, more pieces)."""
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
    relpath: str
    """Its staged shard, under OUT."""
    samples: SampleTable | None = None
    items: tuple[Any, ...] = ()
    first_item: int = 0
    """The position of ``items[0]`` among all items, for messages."""

    def __len__(self) -> int:
        return len(self.samples) if self.samples is not None else len(self.items)

    def inputs(self, source_options: Mapping[str, Any] | None) -> Iterator[tuple[Any, str]]:
        """``(what the map takes, the input's name)`` for each input in order."""
        if self.samples is None:
            for offset, item in enumerate(self.items):
                yield item, f"item {self.first_item + offset}"
            return
        for keys, names, columns in load_batches(self.samples, self.relpath, source_options):
            header = (KEY, *names)
            copies = [list(map(bytes, column)) for column in columns]  # the read buffer is reused
            for row in zip(keys, *copies, strict=True):
                yield dict(zip(header, row, strict=True)), row[0]

    def where(self, position: int) -> str:
        """Where input ``position`` came from, for a message: its files, or the item itself."""
        if self.samples is None:
            return f"{self.items[position]!r:.80}"
        origin = self.samples.origin(position)
        if origin is not None:
            return origin
        cells = [column[position] for column in self.samples.columns if isinstance(column[position], str)]
        return ", ".join(map(str, cells)) or "literal values"


def staged_path(index: int, suffix: str) -> str:
    return f"{STAGING}/piece-{index:06d}{suffix}"


def plan_pieces(jobs: Sequence[Any], suffix: str) -> list[MapPiece]:
    """The pieces of a source's shard plan (``jobs``: each a split's run of samples in plan order), each
    split in equal parts when there are fewer than ``MIN_PIECES`` of them."""
    parts = math.ceil(MIN_PIECES / len(jobs)) if jobs else 1
    pieces: list[MapPiece] = []
    for job in jobs:
        size = math.ceil(len(job.samples) / parts)
        for start in range(0, len(job.samples), size):
            rows = slice(start, start + size)
            pieces.append(
                MapPiece(job.split, len(pieces), staged_path(len(pieces), suffix), job.samples.take(rows))
            )
    return pieces


@dataclass(frozen=True, slots=True)
class MappedPiece:
    """A piece's outputs, in order, staged as one shard: what the shard plan needs, what the journal keeps."""

    split: str
    index: int
    num_inputs: int
    staged: ShardEntry | None
    """The staged shard of its outputs (None when it gave none)."""
    fields: tuple[str, ...]
    """The outputs' field names, sorted (every output of a dataset has the same)."""
    keys: list[str]
    sizes: list[int]
    """Each output's payload bytes (its fields), which the shard cut counts."""
    groups: list[int]
    """How many outputs each input gave, in input order (0 for a dropped or skipped one)."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """``(input name, one-line error)`` of every input left out under ``on_error="skip"``."""

    def to_json(self) -> dict[str, Any]:
        return {"piece": {
            "split": self.split, "index": self.index, "num_inputs": self.num_inputs,
            "staged": None if self.staged is None else self.staged.to_json(), "fields": list(self.fields),
            "keys": self.keys, "sizes": self.sizes, "groups": self.groups, "skipped": self.skipped,
        }}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MappedPiece:
        piece = dict(data["piece"])
        staged = piece["staged"]
        piece["staged"] = None if staged is None else ShardEntry.from_json(staged)
        piece["fields"] = tuple(piece["fields"])
        piece["skipped"] = [tuple(pair) for pair in piece["skipped"]]
        return cls(**piece)


def map_piece(
    piece: MapPiece,
    out: Store,
    format_name: str,
    transform: Transform,
    on_error: OnError = "raise",
    source_options: Mapping[str, Any] | None = None,
) -> MappedPiece:
    """Map one piece's inputs in order, check every output, write them as the piece's staged shard.

    Module-level, its arguments pickle: any executor runs it, and its result depends on them only."""
    out = task_store(out)
    keys: list[str] = []
    sizes: list[int] = []
    groups: list[int] = []
    skipped: list[tuple[str, str]] = []
    apply = transform.bind(sound_inputs=piece.samples is not None)
    staging = _Staging(piece.relpath, out, format_name)
    try:
        for position, (given, name) in enumerate(piece.inputs(source_options)):
            try:
                made = apply(given)
            except Exception as exc:  # the user's function: any error is this input's
                line = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                if on_error == "skip":
                    skipped.append((name, line))
                    groups.append(0)
                    continue
                label = name if piece.samples is None else f"sample {name!r}"
                where = piece.where(position)
                raise MapError(f"the map failed on {label} ({where}): {line}", key=name) from exc
            for key, output in made:
                sizes.append(staging.add(key, output, keys[0] if keys else key))
                keys.append(key)
            groups.append(len(made))
        staged = staging.finish()
    except BaseException:
        staging.abort()
        raise
    _check_unique(keys)
    return MappedPiece(piece.split, piece.index, len(piece), staged, staging.fields, keys, sizes, groups,
                       skipped)  # fmt: skip


class _Staging:
    """A piece's staged shard, opened at its first output (whose fields every other output must have)."""

    def __init__(self, relpath: str, out: Store, format_name: str) -> None:
        self._relpath, self._out, self._format = relpath, out, format_name
        self.fields: tuple[str, ...] = ()
        self._names: set[str] = set()
        self._values: Callable[[Mapping[str, bytes]], tuple[bytes, ...]]  # set with the shard
        self._shard: ShardFile | None = None

    def add(self, key: str, output: Mapping[str, bytes], first_key: str) -> int:
        """Add one checked output; its payload bytes."""
        if self._shard is None:
            self.fields = tuple(sorted(output))
            self._names = set(self.fields)
            self._values = _getter(self.fields)
            self._shard = ShardFile(self._relpath, self._out, self._format, self.fields)
        if output.keys() != self._names:
            raise _fields_differ(key, tuple(sorted(output)), first_key, self.fields)
        values = self._values(output)
        size = sum(map(len, values))
        self._shard.add(key, values, size)
        return size

    def finish(self) -> ShardEntry | None:
        """The staged shard's entry; None when there was no output."""
        return None if self._shard is None else self._shard.finish()

    def abort(self) -> None:
        if self._shard is not None:
            self._shard.abort()


def _getter(fields: Sequence[str]) -> Callable[[Mapping[str, bytes]], tuple[bytes, ...]]:
    """The values of ``fields`` of a sample, in that order, as a tuple (one C call)."""
    pick = operator.itemgetter(*fields)
    if len(fields) == 1:
        return lambda output: (pick(output),)
    return cast(Callable[[Mapping[str, bytes]], tuple[bytes, ...]], pick)


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
    position: np.ndarray
    """Each output's place in its piece's staged shard."""

    @classmethod
    def of(cls, pieces: Sequence[MappedPiece]) -> Outputs:
        _check_agree(pieces)
        counts = [len(p.keys) for p in pieces]
        return cls(
            pieces,
            [key for p in pieces for key in p.keys],
            np.array([size for p in pieces for size in p.sizes], dtype=np.int64),
            np.repeat(np.arange(len(pieces)), counts),
            np.concatenate([np.arange(n) for n in counts]) if pieces else np.zeros(0, np.int64),
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
    """Write one shard of mapped outputs: a whole staged shard is moved into place (its index first), any
    other is written from the staged samples it spans, read and checked. Module-level, its arguments
    pickle: any executor runs it."""
    out = task_store(out)
    if job.whole:
        staged = job.runs[0][0]
        index_path = None
        if staged.index_path is not None:
            index_path = f"{job.relpath}.idx"
            out.move(staged.index_path, index_path)
        out.move(staged.path, job.relpath)
        return replace(staged, path=job.relpath, index_path=index_path)
    fmt = get_format(format_name)
    with ExitStack() as stack, ShardFile(job.relpath, out, format_name, job.fields) as shard:
        for staged, start, stop in job.runs:
            path = stack.enter_context(local_copy(out, staged.path))
            index = None
            if staged.index_path is not None:
                with local_copy(out, staged.index_path) as index_file:
                    index = ShardIndex.read(
                        index_file, staged.num_samples, job.fields, sha256=staged.index_sha256
                    )
            with fmt.open_reader(path, index) as reader:
                keys, columns = reader.read_runs([(start, stop)], job.fields)
            values = [bytecolumn.values(columns[name]) for name in job.fields]
            for key, *sample in zip(keys, *values, strict=True):
                shard.add(key, sample, sum(map(len, sample)))
        return shard.finish()
