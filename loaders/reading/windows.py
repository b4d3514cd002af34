"""Reading a worker's planned windows into columns, under the ``on_error`` policy.

A window is located once across its shards when the format can (``Format.locate``) and landed in the
window's permutation, whole or in pieces that end with batches; else it is read one reader call per run of
spans in the same shard, then reordered. Under ``on_error="skip"`` a failed read goes to :mod:`.repair`,
which finds the bad samples and replaces each, so a window keeps its length and every rank its step count.
Under ``"raise"`` the first ``DataError`` propagates unchanged.
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
from loaders.reading.repair import Repair
from shardpipe.errors import DataError
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
    _repair: Repair = field(init=False, repr=False, compare=False)
    """What finds and replaces the bad samples of a window under ``on_error="skip"``."""

    def __post_init__(self) -> None:
        repair = Repair(self.readers, self.fields, self.shard_paths, self.count_errors)
        object.__setattr__(self, "_repair", repair)  # a frozen dataclass's derived field

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

    def _pieces(
        self, window: Window, order: np.ndarray, yielded: int, *, whole: bool = False
    ) -> Iterator[Columns]:
        """The window at ``order``: located once across its shards (``ShardReaders.locate``) and landed in
        pieces that end where batches of ``piece_size`` do where its fields land (large samples) and not
        ``whole``, else in one; where it cannot be located, and under ``on_error="skip"`` from a piece that
        fails on, read shard by shard, which finds the bad samples."""
        runs = window.runs
        landing = self._locate(runs)
        if landing is not None:
            size, ends = self.piece_size, [len(order)]
            if size is not None and landing.in_pieces and not whole:
                ends = piece_ends(len(order), size, yielded)
            for a, b in itertools.pairwise([0, *ends]):
                try:
                    columns = self._columns(
                        runs, order[a:b], landing.land(order[a:b], self.readers.landing_pool)
                    )
                except DataError:
                    if self.on_error == "raise":
                        raise
                    order = order[a:]
                    break
                yield columns
            else:
                return
        yield self._repair.read(runs, skip=self.on_error == "skip").take(order.tolist())

    def read_window(self, window: Window, order: np.ndarray) -> Columns:
        """The window's samples at ``order`` (positions in read order) in one piece: random access reads
        its picks as a window."""
        return next(self._pieces(window, order, 0, whole=True))

    def _locate(self, runs: Sequence[Run]) -> Landing | None:
        """Where the window's samples lie (``ShardReaders.locate``); ``None`` under ``on_error="skip"`` when
        a reader fails to open or a read fails: the general path then finds the bad samples."""
        try:
            return self.readers.locate(runs, self.fields, scattered=self.scattered)
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
