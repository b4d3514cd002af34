"""Reading a worker's planned windows into columns, under the ``on_error`` policy.

A window's spans are read together when the format can (all its shards in one pass, cut out in the
window's permutation), else one reader call per run of spans in the same shard, then reordered. Under
``on_error="skip"`` a failed read is retried shard by shard, and a failing shard span by span, down to the
bad samples: each becomes a flagged copy of a readable sample of the same window, so a window keeps its
length and every rank its step count. Under ``"raise"`` the first ``DataError`` propagates unchanged.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from loaders.planning.planner import Run, Window
from loaders.reading.columns import Columns
from loaders.reading.readers import ShardReaders
from shardpipe.errors import DataError
from shardpipe.formats import bytecolumn
from shardpipe.formats.landing import Landing
from shardpipe.formats.terms import ColumnsOut

log = logging.getLogger("loaders")

OnError = Literal["raise", "skip"]


def piece_ends(size: int, piece_size: int, yielded: int) -> list[int]:
    """Where the pieces of a window of ``size`` samples end, the last at ``size``: where the messages of
    ``piece_size`` samples end, counted over the ``yielded`` samples before it, so that no message spans
    two pieces (it would be copied again to join them)."""
    return [*range(piece_size - yielded % piece_size, size, piece_size), size]


@dataclass(frozen=True, slots=True)
class WindowReader:
    """Reads windows of one split through one process's open shard readers; ``shard_paths[i]`` names shard
    i in messages, and ``count_errors(n)`` is told of every ``n`` samples skipped as unreadable."""

    readers: ShardReaders
    fields: tuple[str, ...]
    shard_paths: Sequence[str]
    on_error: OnError = "raise"
    count_errors: Callable[[int], None] = lambda count: None
    piece_size: int | None = None
    """The batch size of the batch path: windows of large samples are read in pieces that end with batches."""
    scattered: bool = False
    """Windows of a few samples here and there (random access): landed whatever their size."""
    _stand_in: list[Columns] = field(default_factory=list, init=False, repr=False, compare=False)
    """The dataset's first readable sample, once a window without one needed it (:meth:`stand_in`)."""

    def read(self, windows: Sequence[Window], skip: int) -> Iterator[Columns]:
        """Each window's columns in yield order, the first ``skip`` samples (consumed before a resume) left
        out: whole windows among them are not even read. With a ``piece_size``, a window of large samples
        comes in pieces read straight into their columns (``ShardReaders.locate``), cut where the
        batches of that size end, so that no batch but those that span two windows is copied again."""
        yielded = 0
        for window in windows:
            size = len(window)
            if skip >= size:
                skip -= size
                continue
            for columns in self._pieces(window, window.permutation()[skip:], yielded):
                yielded += len(columns)
                yield columns
            skip = 0

    def _pieces(self, window: Window, order: np.ndarray, yielded: int) -> Iterator[Columns]:
        """The window at ``order``: in landed pieces where the readers can land it, else whole. A piece
        that fails under ``on_error="skip"`` sends the rest of the window the way that finds bad samples."""
        landing = self._locate(window) if self.piece_size is not None else None
        if landing is not None and self.piece_size is not None:
            for a, b in itertools.pairwise([0, *piece_ends(len(order), self.piece_size, yielded)]):
                try:
                    landed = landing.land(order[a:b], self.readers.landing_pool)
                except DataError:
                    if self.on_error == "raise":
                        raise
                    order = order[a:]
                    break
                yield self._columns(window.runs, order[a:b], landed)
            else:
                return
        yield self.read_window(window, order)

    def read_window(self, window: Window, order: np.ndarray) -> Columns:
        """The window's samples at ``order`` (positions in read order): where they are ``scattered``,
        straight into their columns where the readers can land them (``ShardReaders.locate``), else all the
        window's shards read together and cut out in that order when the format can
        (``Format.read_across``), else shard by shard, which finds the bad samples under
        ``on_error="skip"``."""
        runs = window.runs
        try:
            landing = self.readers.locate(runs, self.fields, scattered=True) if self.scattered else None
            joined = (
                landing.land(order, self.readers.landing_pool)
                if landing is not None
                else self.readers.read_window(runs, self.fields, order)
            )
            if joined is not None:
                return self._columns(runs, order, joined)
        except DataError:
            if self.on_error == "raise":
                raise
        pieces: list[Columns] = []
        bad: list[int] = []
        first = 0
        while first < len(runs):
            last = first + 1
            while last < len(runs) and runs[last].shard_index == runs[first].shard_index:
                last += 1
            group = runs[first:last]
            try:
                pieces.append(self._read_group(group))
            except DataError:
                if self.on_error == "raise":
                    raise
                for run in group:  # find the bad samples span by span
                    self._read_run_skipping(pieces, run, bad)
            first = last
        columns = Columns.concat(self.fields, pieces)
        if bad:
            columns = self._replace_errors(columns, bad, runs)
        return columns.take(order.tolist())

    def _replace_errors(self, columns: Columns, bad: list[int], runs: Sequence[Run]) -> Columns:
        """Each unreadable slot filled with a copy of a readable sample of the window, flagged as a pad;
        where the window has none (a small window, or a mixture's small part of one, inside a damaged
        stretch), with copies of :meth:`stand_in`, so that steps stay equal."""
        unreadable = set(bad)
        good = next((i for i in range(len(columns)) if i not in unreadable), None)
        if good is None:
            stand_in = self.stand_in()
            if stand_in is None:
                names = ", ".join(sorted({self.shard_paths[run.shard_index] for run in runs}))
                raise DataError(
                    f"every sample of a read window in {names} is unreadable, and so is the first sample "
                    "of every shard; run `shardpipe verify`"
                )
            filled = stand_in.take([0] * len(columns))
            filled.pads, filled.shards = [True] * len(columns), columns.shards
            return filled
        for i in bad:
            columns.keys[i] = columns.keys[good]
            columns.pads[i] = True
        order = np.arange(len(columns))
        order[bad] = good
        for name in columns.names:
            columns.fields[name] = bytecolumn.take(columns.fields[name], order)
        return columns

    def stand_in(self) -> Columns | None:
        """The first sample of the first shard that reads it (``None`` if none does): what fills a window
        none of whose samples can be read, the same whatever this reader read before, so a resumed run
        fills it alike."""
        if not self._stand_in:
            for shard_index in range(len(self.shard_paths)):
                try:
                    self._stand_in.append(self._read_group([Run(shard_index, 0, 1, False)]))
                    break
                except DataError:
                    continue
        return self._stand_in[0] if self._stand_in else None

    def _locate(self, window: Window) -> Landing | None:
        """Where the window's samples lie, to be landed (``ShardReaders.locate``); ``None`` under
        ``on_error="skip"`` when a reader fails to open: the general path then finds the bad samples."""
        try:
            return self.readers.locate(window.runs, self.fields)
        except DataError:
            if self.on_error == "raise":
                raise
            return None

    def _columns(self, runs: Sequence[Run], order: np.ndarray, joined: ColumnsOut) -> Columns:
        """The columns of samples ``order`` of ``runs`` read together, decompressed where stored so."""
        keys, fields = joined
        if len(runs) == 1:  # one shard's run (a single get): the same shard and flag for every sample
            run = runs[0]
            if (codecs := self.readers.codecs) is not None:
                indexes = (np.arange(run.start, run.stop)[order]).tolist()
                fields = codecs.decode_columns(keys, fields, self.shard_paths[run.shard_index], indexes)
            pads, shards = [bool(run.is_pad)] * len(order), [run.shard_index] * len(order)
            return Columns(self.fields, keys, fields, pads, shards)
        lengths = [run.stop - run.start for run in runs]
        shard_of = np.repeat([run.shard_index for run in runs], lengths)[order]
        if (codecs := self.readers.codecs) is not None:
            indexes = np.concatenate([np.arange(run.start, run.stop) for run in runs])[order]
            names = [self.shard_paths[i] for i in shard_of.tolist()]
            fields = codecs.decode_columns(keys, fields, names, indexes)
        pads = np.repeat([bool(run.is_pad) for run in runs], lengths)[order].tolist()
        return Columns(self.fields, keys, fields, pads, shard_of.tolist())

    def _read_group(self, group: Sequence[Run]) -> Columns:
        """The samples of spans of one shard, all or none."""
        shard_index = group[0].shard_index
        with self.readers.reading(shard_index) as reader:
            keys, fields = reader.read_runs([(run.start, run.stop) for run in group], self.fields)
        expected = sum(run.stop - run.start for run in group)
        if len(keys) != expected:
            raise DataError(
                f"{self.shard_paths[shard_index]}: read {len(keys)} samples, expected {expected}; truncated? "
                "run `shardpipe verify`"
            )
        if (codecs := self.readers.codecs) is not None:
            indexes = [i for run in group for i in range(run.start, run.stop)]
            fields = codecs.decode_columns(keys, fields, self.shard_paths[shard_index], indexes)
        pads = [bool(run.is_pad) for run in group for _ in range(run.stop - run.start)]
        return Columns(self.fields, keys, fields, pads, [shard_index] * len(pads))

    def _read_run_skipping(self, pieces: list[Columns], run: Run, bad: list[int]) -> None:
        """Read one span sample range by sample range, leaving a placeholder for each unreadable sample
        (``bad`` gets its position in the window ``pieces`` make up)."""
        shard_index, start, stop, is_pad = run
        while start < stop:
            try:
                pieces.append(self._read_group([Run(shard_index, start, stop, is_pad)]))
                return
            except DataError as exc:
                failed = getattr(exc, "sample_index", None)
                failed = failed if failed is not None and start <= failed < stop else start
                log.warning(
                    "skipping unreadable sample %d of %s: %s", failed, self.shard_paths[shard_index], exc
                )
                self.count_errors(1)
                if failed > start:  # the samples ahead of the bad one are good
                    pieces.append(self._read_group([Run(shard_index, start, failed, is_pad)]))
                bad.append(sum(map(len, pieces)))
                names = self.fields
                pieces.append(Columns(names, [""], {name: [b""] for name in names}, [True], [shard_index]))
                start = failed + 1
