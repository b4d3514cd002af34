"""Reading a window under ``on_error="skip"``: the bad samples found and each replaced.

A window whose read failed is read again shard by shard, and a failing shard span by span, down to the
bad samples: each becomes a flagged copy (``__pad__``) of a readable sample of the same window, so that a
window keeps its length and every rank its step count. A window none of whose samples reads is filled with
the dataset's first readable sample (:meth:`Repair.stand_in`), the same whatever was read before, so a
resumed run fills it alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from loaders.planning.planner import Run
from loaders.reading.columns import Columns
from loaders.reading.readers import ShardReaders
from shardpipe.errors import DataError
from shardpipe.formats import bytecolumn

log = logging.getLogger("loaders")


@dataclass(frozen=True, slots=True)
class Repair:
    """Finds and replaces a window's bad samples, read through ``readers``; ``shard_paths[i]`` names shard
    i in messages and ``count_errors(n)`` is told of every ``n`` samples skipped."""

    readers: ShardReaders
    fields: tuple[str, ...]
    shard_paths: Sequence[str]
    count_errors: Callable[[int], None]
    _stand_in: list[Columns] = field(default_factory=list, init=False, repr=False, compare=False)
    """The dataset's first readable sample, once a window without one needed it."""

    def read(self, runs: Sequence[Run], *, skip: bool) -> Columns:
        """The samples of ``runs`` in read order, read shard by shard; with ``skip``, each bad one
        replaced, else the first ``DataError`` raised."""
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
                if not skip:
                    raise
                for run in group:  # find the bad samples span by span
                    self._read_run_skipping(pieces, run, bad)
            first = last
        columns = Columns.concat(self.fields, pieces)
        return self._replace(columns, bad, runs) if bad else columns

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

    def _replace(self, columns: Columns, bad: list[int], runs: Sequence[Run]) -> Columns:
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
        none of whose samples can be read."""
        if not self._stand_in:
            for shard_index in range(len(self.shard_paths)):
                try:
                    self._stand_in.append(self._read_group([Run(shard_index, 0, 1, False)]))
                    break
                except DataError:
                    continue
        return self._stand_in[0] if self._stand_in else None

    def _read_group(self, group: Sequence[Run]) -> Columns:
        """The samples of spans of one shard, all or none (else :class:`~shardpipe.errors.DataError`)."""
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
