"""Reading spans of LMDB shards: records walked by key through read transactions, decoded by
:mod:`.framing` (checked against their checksums), never unpickled.

A reader owns its hold on the file's environment (:mod:`.lmdb_env`): it maps the file when created and lets
go on ``close()`` (or when dropped). An environment never crosses a fork: create a reader in the process
that reads (a DataLoader worker, after the fork); one used in another process raises. A record's header
must agree with its length, and no record may be longer than the file, so damage reads as an error, not a
fault on a page past the file's end.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from itertools import groupby, islice
from pathlib import Path
from typing import cast

import lmdb
import numpy as np

from shardpipe.errors import CorruptShardError, UsageError
from shardpipe.formats import framing
from shardpipe.formats.base import ReaderBase
from shardpipe.formats.layout import SampleLayout
from shardpipe.formats.lmdb_env import COUNT_KEY, INDEX, VERSION_KEY, acquire, release, small
from shardpipe.formats.readbuffer import ReadBuffer
from shardpipe.formats.terms import ColumnsOut, Fields

_PIECE_RECORDS = 256
"""Records a read walks before it joins them. Each is a view, an object the garbage collector tracks: a
whole window's views held at once set off its collections, and each moves them on towards scans of every
object in the process (docs/design.md, "Reading")."""


def run_at(runs: Iterable[tuple[int, int]], position: int) -> tuple[int, int]:
    """Which run holds the ``position``-th sample read by ``runs``, and that sample's index."""
    for run, (start, stop) in enumerate(runs):
        if position < stop - start:
            return run, start + position
        position -= stop - start
    raise IndexError(position)


class LmdbReader(ReaderBase):
    """Reads spans of one LMDB shard through the environment it holds (see the module docstring)."""

    def __init__(self, path: Path, index: object = None, *, check: bool = True) -> None:
        """``index`` is ignored: LMDB seeks by key. Checks need framing version 2 (older shards have none)."""
        self.shard = shard = str(path)
        """The file, for error messages."""
        self._pid = os.getpid()
        self._env, key, self.file_size = acquire(path)
        self._closer = weakref.finalize(self, release, key, self._pid)
        try:
            with self._env.begin(buffers=True) as txn:
                count, version = (small(txn.get(k)) for k in (COUNT_KEY, VERSION_KEY))
        except lmdb.Error as exc:
            self.close()
            raise CorruptShardError.at(shard, f"LMDB: {exc}") from exc
        if not count.isdigit() or not version.isdigit() or int(version) not in framing.VERSIONS:
            self.close()
            raise CorruptShardError.at(shard, f"bad metadata: count {count!r}, framing version {version!r}")
        self.num_samples = int(count)
        self.version = int(version)
        """The shard's framing version."""
        self.check = check
        """Whether each record is checked against its checksum (version 2)."""
        self._buffer = ReadBuffer()

    def read(self, start: int, stop: int) -> Iterator[tuple[str, Fields]]:
        runs = [(start, stop)]
        self.check_runs(runs)
        try:
            with self._env.begin(buffers=True) as txn:
                position = 0
                for piece, _ in self.pieces(txn, runs):
                    for record in piece:
                        yield self.decode(record, run_at(runs, position)[1])
                        position += 1
        except lmdb.Error as exc:
            raise CorruptShardError.at(self.shard, f"LMDB: {exc}", sample_index=start) from exc

    def read_runs(self, runs: Sequence[tuple[int, int]], names: Sequence[str]) -> ColumnsOut:
        """Every run through one read transaction, and the records landed together
        (:func:`decode_parts`): a window reads hundreds of runs of a few samples."""
        parts = [(self, start, stop) for start, stop in runs]
        return decode_parts(parts, names, self._buffer, version=self.version, check=self.check)

    def begin(self) -> lmdb.Transaction:
        """A read transaction whose records are views of the map, after :meth:`check_runs`."""
        self.check_runs([])
        return self._env.begin(buffers=True)

    def pieces(
        self, txn: lmdb.Transaction, runs: Sequence[tuple[int, int]]
    ) -> Iterator[tuple[list[memoryview], list[int]]]:
        """The records of ``runs`` in order, ``_PIECE_RECORDS`` or a few more at a time, and their sizes:
        views into the map, valid while ``txn`` lives, none longer than the file (a damaged length must
        never lead a copy past the file's end)."""
        shard, cursor, piece, position = self.shard, txn.cursor(), list[memoryview](), 0
        for start, stop in runs:
            for first in range(start, stop, _PIECE_RECORDS):
                last = min(stop, first + _PIECE_RECORDS)
                if not cursor.set_key(INDEX.pack(first)):
                    raise CorruptShardError.at(shard, "no record under this index", sample_index=first)
                had = len(piece)
                values = cast(Iterator[memoryview], cursor.iternext(keys=False, values=True))  # buffers=True
                piece += islice(values, last - first)
                if len(piece) - had != last - first or small(cursor.key()) != INDEX.pack(last - 1):
                    raise CorruptShardError.at(
                        shard, "records are missing or out of order", sample_index=first
                    )
                if len(piece) >= _PIECE_RECORDS:
                    yield piece, self._sizes(piece, runs, position)
                    position, piece = position + len(piece), []
        if piece:
            yield piece, self._sizes(piece, runs, position)

    def _sizes(self, piece: list[memoryview], runs: Sequence[tuple[int, int]], position: int) -> list[int]:
        """The sizes of ``piece``, the records read from ``position`` on; refuses one longer than the file."""
        sizes = list(map(len, piece))
        if max(sizes) > self.file_size:
            at = next(i for i, size in enumerate(sizes) if size > self.file_size)
            detail = f"record of {sizes[at]:,} bytes"
            raise CorruptShardError.at(self.shard, detail, sample_index=run_at(runs, position + at)[1])
        return sizes

    def check_runs(self, runs: Sequence[tuple[int, int]]) -> None:
        """Raise unless this reader is open, in the process that made it, and holds ``runs``' samples."""
        shard = self.shard
        if os.getpid() != self._pid:
            raise UsageError(
                f"the LMDB reader of {shard} was created in process {self._pid} and used in {os.getpid()}: "
                "an environment must not cross a fork; create readers in the process that reads"
            )
        self.check_open()
        for start, stop in runs:
            if not 0 <= start <= stop <= self.num_samples:
                detail = f"samples [{start}, {stop}) requested, the shard holds '{self.num_samples}'"
                raise CorruptShardError.at(shard, detail, sample_index=min(max(start, 0), self.num_samples))

    def decode(self, value: bytes | memoryview, index: int) -> tuple[str, Fields]:
        """Record ``value`` of sample ``index`` as its key and fields, checked; damage names the sample."""
        if len(value) > self.file_size:  # a damaged length: never touch bytes past the file
            raise CorruptShardError.at(self.shard, f"record of {len(value):,} bytes", sample_index=index)
        try:
            return framing.decode(value, version=self.version, check=self.check)
        except framing.FramingError as exc:
            raise CorruptShardError.at(self.shard, str(exc), sample_index=index) from exc

    def scan(self) -> tuple[list[str], list[SampleLayout], int]:
        """Decode (and check) every record in key order, as the writer's ``close()`` describes them."""
        shard = self.shard
        keys: list[str] = []
        layouts: list[SampleLayout] = []
        try:
            with self._env.begin(buffers=True) as txn:
                for raw_key, value in txn.cursor():
                    raw = small(raw_key)
                    if raw in (COUNT_KEY, VERSION_KEY):
                        continue
                    if raw != INDEX.pack(len(keys)):
                        detail = f"unexpected key {raw!r}"
                        raise CorruptShardError.at(shard, detail, sample_index=len(keys))
                    key, fields = self.decode(value, len(keys))
                    layouts.append(SampleLayout(len(keys), None, dict.fromkeys(fields)))
                    keys.append(key)
        except lmdb.Error as exc:
            raise CorruptShardError.at(shard, f"LMDB: {exc}", sample_index=len(keys)) from exc
        if self.num_samples != len(keys):
            detail = f"{COUNT_KEY!r} says {self.num_samples}, found {len(keys)} records"
            raise CorruptShardError.at(shard, detail)
        return keys, layouts, len(keys)


Part = tuple[LmdbReader, int, int]
"""Samples ``[start, stop)`` of the shard a reader has open."""


def decode_parts(
    parts: Sequence[Part],
    names: Sequence[str],
    buffer: ReadBuffer,
    *,
    version: int,
    check: bool,
    order: np.ndarray | None = None,
) -> ColumnsOut:
    """The records of ``parts`` (from readers open in this process) landed together, in ``order``
    (positions among the records in read order, a subset allowed; all in turn when ``None``): one read
    transaction per shard, each shard's runs walked once (a shard's parts next to each other), a bad
    record named by its shard and sample.

    Small records are copied into ``buffer`` a piece at a time as they are walked, and landed from there
    (:func:`framing.decode_many`), so only a piece's views live at once and the window's bytes land in
    memory already used (a fresh buffer per window costs a page fault per 4 KiB). Large ones, as the first
    piece shows them, are landed where they lie.
    """
    joined, sizes, end = buffer.view(0), list[int](), 0
    views: list[memoryview] = []
    with ExitStack() as stack:
        txns: dict[LmdbReader, lmdb.Transaction] = {}
        for reader, group in groupby(parts, key=lambda part: part[0]):
            runs = [(start, stop) for _, start, stop in group]
            reader.check_runs(runs)
            try:
                if reader not in txns:
                    txns[reader] = stack.enter_context(reader.begin())
                for piece, lengths in reader.pieces(txns[reader], runs):
                    size = sum(lengths)
                    if views or not (sizes or framing.worth_joining(len(piece), size)):
                        views += piece
                        continue
                    start, end = end, end + size
                    joined = buffer.view(end, keep=start)
                    joined[start:end] = b"".join(piece)
                    sizes += lengths
            except lmdb.Error as exc:
                raise CorruptShardError.at(reader.shard, f"LMDB: {exc}", sample_index=runs[0][0]) from exc

        def locate(position: int) -> tuple[str, int]:
            run, sample = run_at(((start, stop) for _, start, stop in parts), position)
            return parts[run][0].shard, sample

        records, known = (joined, sizes) if sizes else (views, None)
        return framing.decode_many(
            records, names, locate, version=version, check=check, sizes=known, order=order
        )
