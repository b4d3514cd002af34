"""LMDB records read straight from LMDB's own map: a window's records landed a piece at a time
(:mod:`.landing`), and random gets one record at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, cast

import lmdb
import numpy as np

from shardpipe.errors import CorruptShardError
from shardpipe.formats import framing
from shardpipe.formats.landing import Located, columns_of
from shardpipe.formats.leases import BufferPool
from shardpipe.formats.lmdb_env import INDEX
from shardpipe.formats.lmdb_reader import LmdbReader, Part, decode_parts
from shardpipe.formats.readbuffer import ReadBuffer
from shardpipe.formats.terms import ColumnsOut


class LmdbWindow:
    """A window's records, landed a piece at a time (:mod:`.landing`) from LMDB's own map: each piece's
    records are looked up by key through one read transaction per shard, their headers read as arrays
    (:func:`framing.record_spans`), and each record hashed and its large fields copied where LMDB maps it."""

    def __init__(
        self,
        parts: Sequence[Part],
        names: Sequence[str],
        *,
        version: int,
        check: bool,
        one_by_one: bool = False,
    ) -> None:
        """``one_by_one``: records decoded in turn, not as arrays (scattered ones: a few here and there)."""
        self._readers = list(dict.fromkeys(reader for reader, _, _ in parts))
        slot = {reader: i for i, reader in enumerate(self._readers)}
        runs: dict[LmdbReader, list[tuple[int, int]]] = {reader: [] for reader in self._readers}
        for reader, start, stop in parts:
            runs[reader].append((start, stop))
        for reader, its_runs in runs.items():
            reader.check_runs(its_runs)
        self._records_at = [(slot[reader], i) for reader, start, stop in parts for i in range(start, stop)]
        """``(reader, record)`` of each position in read order."""
        self._names, self._version, self._check = tuple(names), version, check
        self._one_by_one = one_by_one
        self.in_pieces = not one_by_one

    def land(self, order: np.ndarray, pool: BufferPool) -> ColumnsOut:
        if not len(order):
            return [], {name: [] for name in self._names}
        if self._one_by_one:
            picks = [self._records_at[i] for i in order.tolist()]
            return columns_of(read_samples(dict(enumerate(self._readers)), picks, self._names), self._names)
        with self._records(order) as (views, locate):
            return framing.decode_many(
                views, self._names, locate, version=self._version, check=self._check, pool=pool
            )

    @contextmanager
    def located(self, order: np.ndarray) -> Iterator[Located | None]:
        with self._records(order) as (views, locate):
            sizes = np.fromiter(map(len, views), np.int64, len(views))
            spans = framing.record_spans(views, sizes, self._names, version=self._version, check=self._check)
            yield None if spans is None else Located(spans, locate)

    @contextmanager
    def _records(
        self, order: np.ndarray
    ) -> Iterator[tuple[list[memoryview], Callable[[int], tuple[str, int]]]]:
        """The records at ``order`` as views into LMDB's map, valid inside (one read transaction per shard),
        and what names record i; a missing or overlong record is named first."""
        where = self._records_at
        picked = [where[i] for i in order.tolist()]
        reader_of, sample_of = [r for r, _ in picked], [s for _, s in picked]
        readers = self._readers

        def locate(i: int) -> tuple[str, int]:
            return readers[reader_of[i]].shard, sample_of[i]

        with ExitStack() as stack:
            gets = _lookups(stack, {slot: readers[slot] for slot in dict.fromkeys(reader_of)})
            try:
                records = [gets[r](INDEX.pack(s)) for r, s in zip(reader_of, sample_of, strict=True)]
            except lmdb.Error as exc:
                raise CorruptShardError.at(readers[reader_of[0]].shard, f"LMDB: {exc}") from exc
            for i, record in enumerate(records):
                if record is None or len(record) > readers[reader_of[i]].file_size:
                    what = (
                        "no record under this index" if record is None else f"record of {len(record):,} bytes"
                    )
                    raise CorruptShardError.at(readers[reader_of[i]].shard, what, sample_index=sample_of[i])
            yield cast(list[memoryview], records), locate


class JoinedRecords:
    """A window's small records, copied into one buffer and landed there (:func:`decode_parts`): whole,
    in the order asked, through ``buffer``."""

    in_pieces = False

    def __init__(
        self, parts: Sequence[Part], names: Sequence[str], buffer: ReadBuffer, *, version: int, check: bool
    ) -> None:
        self._parts, self._names, self._buffer = parts, tuple(names), buffer
        self._version, self._check = version, check

    def land(self, order: np.ndarray | None, pool: BufferPool | None = None) -> ColumnsOut:
        return decode_parts(
            self._parts, self._names, self._buffer, version=self._version, check=self._check, order=order
        )

    @contextmanager
    def located(self, order: np.ndarray) -> Iterator[Located | None]:
        yield None  # nothing lands in a caller's buffers: small records are gathered


def _lookups(stack: ExitStack, readers: Mapping[int, LmdbReader]) -> dict[int, Callable[[bytes], Any]]:
    """Each reader's ``get`` (a record by key, as a view of LMDB's map) through one read transaction,
    closed with ``stack``; each reader checked first (this process's, still open)."""
    return {slot: stack.enter_context(reader.begin()).get for slot, reader in readers.items()}


def read_samples(
    readers: Mapping[int, LmdbReader], picks: Sequence[tuple[int, int]], names: Sequence[str]
) -> list[dict[str, Any]]:
    """Each ``(shard, record)`` of ``picks`` as a dict of its fields of ``names`` and ``__key__``: looked
    up in its shard's read transaction and decoded (``framing.decode``). Random gets, and a scattered
    window's records (:class:`LmdbWindow`)."""
    out = []
    with ExitStack() as stack:
        gets = _lookups(stack, readers)
        for shard, i in picks:
            try:
                record = gets[shard](INDEX.pack(i))
            except lmdb.Error as exc:
                raise CorruptShardError.at(readers[shard].shard, f"LMDB: {exc}", sample_index=i) from exc
            if record is None:
                detail = "no record under this index"
                raise CorruptShardError.at(readers[shard].shard, detail, sample_index=i)
            key, fields = readers[shard].decode(record, i)
            sample: dict[str, Any] = fields
            if len(fields) != len(names):  # a record holds every field of the split, as a rule
                sample = {name: fields[name] for name in names if name in fields}
            sample["__key__"] = key
            out.append(sample)
    return out
