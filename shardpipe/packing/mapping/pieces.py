"""A map pack's first step: the inputs cut into pieces, each mapped in order and staged as one shard.

The pieces are planned from the inputs and options alone (:func:`plan_pieces`; Python items:
:func:`shardpipe.packing.items.plan_item_pieces`), so any engine maps the same pieces; one task maps one
piece (:func:`map_piece`) and returns what the second step (:mod:`.shards`) and the journal need
(:class:`MappedPiece`). :mod:`shardpipe.packing.mapping` says why the plan has two steps.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from shardpipe.packing.mapping import MapError, check_unique_keys, fields_differ
from shardpipe.packing.samples import KEY
from shardpipe.packing.shard_writing import ShardFile, load_batches
from shardpipe.packing.transform import OnError, Transform
from shardpipe.shardtable import ShardEntry
from shardpipe.sources import SampleTable
from shardpipe.storage import Store

STAGING = ".shardpipe-staging"
"""Where a pack with a map stages its mapped pieces, under OUT; removed once the manifest is in place."""
MIN_PIECES = 8
"""A job planned into fewer shards is mapped in at least this many pieces (more shards, more pieces)."""
MAX_SKIPPED_NAMED = 100
"""Skipped inputs named one by one in the manifest; the count covers them all."""


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
        piece = {
            "split": self.split,
            "index": self.index,
            "num_inputs": self.num_inputs,
            "staged": None if self.staged is None else self.staged.to_json(),
            "fields": list(self.fields),
            "keys": self.keys,
            "sizes": self.sizes,
            "groups": self.groups,
            "skipped": self.skipped,
        }
        return {"piece": piece}

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
    check_unique_keys(keys)
    return MappedPiece(
        split=piece.split,
        index=piece.index,
        num_inputs=len(piece),
        staged=staged,
        fields=staging.fields,
        keys=keys,
        sizes=sizes,
        groups=groups,
        skipped=skipped,
    )


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
            raise fields_differ(key, tuple(sorted(output)), first_key, self.fields)
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
