"""LMDB shards: one single-file environment per shard, samples under 8-byte big-endian indices.

Values are :mod:`shardpipe.formats.framing` records (version 2: each with its checksum), never pickles.
Two metadata entries sort after every index key: ``__count__`` (ASCII sample count) and ``__shardpipe__``
(framing version). The writer opens the file without a lock file (``lock=False``), so renaming the one file
publishes the whole shard. It buffers records and commits them in chunks with ``append=True``, doubling the
map whenever LMDB reports it full, so nobody has to guess a map size, and the file only holds the pages
written.

A reader owns its environment: it maps the file when created and unmaps it on ``close()`` (or when
dropped). An environment never crosses a fork: create a reader in the process that reads (a DataLoader
worker, after the fork); one used in another process raises. py-lmdb opens a file once per process, so
readers of one file in one process share its environment, which is unmapped when the last one closes.
Before LMDB touches a page the file must hold every page its metadata claims, and a record's header must
agree with its length, so damage reads as an error, not a fault (SIGBUS) on a page past the file's end.
"""

from __future__ import annotations

import os
import struct
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from itertools import groupby, islice
from pathlib import Path
from typing import Any, cast

import lmdb
import numpy as np

from shardpipe.errors import CorruptShardError, DataError, UsageError
from shardpipe.formats import framing
from shardpipe.formats.base import FormatBase, Offsets, ReaderBase, RemoteBytes, ShardReader
from shardpipe.formats.landing import LANDED_MIN_BYTES, BufferPool, Located, columns_of, land, lands
from shardpipe.formats.layout import (
    KEY_START,
    KEY_STOP,
    NO_SPAN,
    OFFSET,
    PARSE,
    SampleLayout,
    ShardIndex,
    fixed_columns,
)
from shardpipe.formats.readbuffer import ReadBuffer
from shardpipe.formats.terms import Column, ColumnsOut, Fields

COUNT_KEY = b"__count__"
VERSION_KEY = b"__shardpipe__"
_INDEX = struct.Struct(">Q")
_INITIAL_MAP_SIZE = 1 << 24
_PIECE_RECORDS = 256
"""Records a read walks before it joins them. Each is a view, an object the garbage collector tracks: a
whole window's views held at once set off its collections, and each moves them on towards scans of every
object in the process (docs/design.md, "Reading")."""
_CHUNK_BYTES = 1 << 20
"""Bytes of records that trigger a commit. Small, so that a record is still in the CPU cache when LMDB
copies it into its page and that page when the commit writes it."""


def _open(path: Path, **options: Any) -> lmdb.Environment:
    return lmdb.open(str(path), subdir=False, lock=False, **options)


class LmdbWriter:
    """Buffers framed samples and commits them in chunks under consecutive index keys."""

    def __init__(self, path: Path) -> None:
        Path(path).unlink(missing_ok=True)  # a stale file would be appended to, not replaced
        self._shard = str(path)
        try:
            self._env = _open(path, map_size=_INITIAL_MAP_SIZE, sync=False, metasync=False, readahead=False)
        except lmdb.Error as exc:
            raise DataError(f"cannot create LMDB shard {path}: {exc}") from exc
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._num_samples = 0
        self._batches: list[tuple[tuple[str, ...], np.ndarray]] = []

    def write(self, key: str, fields: Mapping[str, bytes]) -> None:
        self.write_batch([key], list(fields), [[data] for data in fields.values()])

    def write_batch(self, keys: Sequence[str], names: Sequence[str], columns: Sequence[Column]) -> None:
        if not keys:
            return
        first = self._num_samples
        records = [b"".join(pieces) for pieces in framing.encode_batch(keys, names, columns)]
        self._pending += zip(map(_INDEX.pack, range(first, first + len(keys))), records, strict=True)
        self._pending_bytes += sum(map(len, records))
        self._num_samples += len(keys)
        self._batches.append((tuple(sorted(names)), _rows(first, len(keys), len(names))))
        if self._pending_bytes >= _CHUNK_BYTES:
            self._commit()

    def _commit(self) -> None:
        try:
            self._put_pending()
        except lmdb.Error as exc:  # a full disk, say: name the shard
            raise DataError(f"cannot write LMDB shard {self._shard}: {exc}") from exc
        self._pending, self._pending_bytes = [], 0

    def _put_pending(self) -> None:
        # Grow the map ahead of the chunk (room for twice its bytes: B-tree and overflow-page slack), so a
        # MapFullError, which throws the whole chunk's transaction away, stays the rare fallback.
        info = self._env.info()
        needed = (info["last_pgno"] + 1) * self._env.stat()["psize"] + 2 * self._pending_bytes + (1 << 20)
        if info["map_size"] < needed:
            self._env.set_mapsize(max(info["map_size"] * 2, needed))
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    txn.cursor().putmulti(self._pending, append=True)
                break
            except lmdb.MapFullError:
                self._env.set_mapsize(self._env.info()["map_size"] * 2)

    def abort(self) -> None:
        self._env.close()

    def close(self) -> ShardIndex:
        self._pending += [(COUNT_KEY, b"%d" % self._num_samples), (VERSION_KEY, b"%d" % framing.VERSION)]
        self._commit()
        self._env.close()  # committed pages are in the page cache; the pack stage fsyncs the shard
        return ShardIndex.from_batches(self._batches, self._num_samples)


def _rows(first: int, num_samples: int, num_fields: int) -> np.ndarray:
    """LMDB seeks by key, not by byte: a sample's "offset" is its position and spans are not recorded."""
    rows = np.full((num_samples, fixed_columns(2) + 2 * num_fields), NO_SPAN, dtype="<u8")  # version-2 rows
    rows[:, OFFSET] = np.arange(first, first + num_samples)
    rows[:, KEY_START : KEY_STOP + 1] = PARSE
    return rows


_shared: dict[tuple[int, int], list[Any]] = {}  # (device, inode) -> [environment, readers holding it]
_shared_pid = os.getpid()


def _acquire(path: Path) -> tuple[lmdb.Environment, tuple[int, int], int]:
    """This process's read-only environment for ``path`` (mapped now, or shared with a live reader of the
    same file), its registry key and the file's size.

    Environments inherited through a fork are closed in the child, never used: closing frees the child's
    copy of the mapping and clears py-lmdb's per-process "already open" mark, which a fork also copies.
    """
    global _shared_pid
    shard = str(path)
    if _shared_pid != os.getpid():
        for env, _ in _shared.values():
            env.close()
        _shared.clear()
        _shared_pid = os.getpid()
    try:
        stat = Path(path).stat()
    except OSError as exc:
        raise DataError(f"cannot open shard {shard}: {exc.strerror}") from exc
    key = (stat.st_dev, stat.st_ino)
    if key in _shared:
        _shared[key][1] += 1
        return _shared[key][0], key, stat.st_size
    try:
        env = _open(path, readonly=True, readahead=True, max_spare_txns=1)
    except lmdb.Error as exc:
        raise CorruptShardError.at(shard, f"cannot open LMDB environment: {exc}") from exc
    try:
        _check_complete(env, stat.st_size, shard)
    except BaseException:
        env.close()
        raise
    _shared[key] = [env, 1]
    return env, key, stat.st_size


def _release(key: tuple[int, int], pid: int) -> None:
    """Drop a reader's hold; the last one unmaps the environment (never in another process)."""
    entry = _shared.get(key)
    if entry is None or pid != os.getpid() or _shared_pid != pid:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _shared[key]
        entry[0].close()


def _check_complete(env: lmdb.Environment, file_size: int, shard: str) -> None:
    """A truncated file would fault the process (SIGBUS) when LMDB touches a missing page: refuse it first."""
    try:
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    except lmdb.Error as exc:
        raise CorruptShardError.at(shard, f"unreadable LMDB metadata: {exc}") from exc
    if file_size < needed:
        raise CorruptShardError.at(shard, f"truncated: {file_size:,} bytes, its pages need {needed:,}")


def _run_at(runs: Iterable[tuple[int, int]], position: int) -> tuple[int, int]:
    """Which run holds the ``position``-th sample read by ``runs``, and that sample's index."""
    for run, (start, stop) in enumerate(runs):
        if position < stop - start:
            return run, start + position
        position -= stop - start
    raise IndexError(position)


def _small(value: bytes | memoryview | None) -> bytes:
    """A key or metadata value as bytes; ``b"?"`` when it is too long to be one, without touching it (a
    damaged length must not lead the copy past the file's end)."""
    if value is None:
        return b""
    return bytes(value) if len(value) <= 64 else b"?"


class LmdbReader(ReaderBase):
    """Reads spans of one LMDB shard through one environment it owns (see the module docstring)."""

    def __init__(self, path: Path, index: object = None, *, check: bool = True) -> None:
        """``index`` is ignored: LMDB seeks by key. Checks need framing version 2 (older shards have none)."""
        self._shard = shard = str(path)
        self._pid = os.getpid()
        self._env, key, self._file_size = _acquire(path)
        self._closer = weakref.finalize(self, _release, key, self._pid)
        try:
            with self._env.begin(buffers=True) as txn:
                count, version = (_small(txn.get(k)) for k in (COUNT_KEY, VERSION_KEY))
        except lmdb.Error as exc:
            self.close()
            raise CorruptShardError.at(shard, f"LMDB: {exc}") from exc
        if not count.isdigit() or not version.isdigit() or int(version) not in framing.VERSIONS:
            self.close()
            raise CorruptShardError.at(shard, f"bad metadata: count {count!r}, framing version {version!r}")
        self.num_samples = int(count)
        self._version = int(version)
        self._check = check
        self._buffer = ReadBuffer()

    def read(self, start: int, stop: int) -> Iterator[tuple[str, Fields]]:
        yield from self._read([(start, stop)])

    def read_runs(self, runs: Sequence[tuple[int, int]], names: Sequence[str]) -> ColumnsOut:
        """Every run through one read transaction, and the records decoded together
        (:meth:`_decode_parts`): a window reads hundreds of runs of a few samples."""
        parts = [(self, start, stop) for start, stop in runs]
        return self._decode_parts(parts, names, self._buffer, version=self._version, check=self._check)

    def _read(self, runs: Sequence[tuple[int, int]]) -> Iterator[tuple[str, Fields]]:
        self._check_runs(runs)
        try:
            with self._env.begin(buffers=True) as txn:
                position = 0
                for piece, _ in self._pieces(txn, runs):
                    for record in piece:
                        yield self._decode(record, _run_at(runs, position)[1])
                        position += 1
        except lmdb.Error as exc:
            raise CorruptShardError.at(self._shard, f"LMDB: {exc}", sample_index=runs[0][0]) from exc

    def _pieces(
        self, txn: lmdb.Transaction, runs: Sequence[tuple[int, int]]
    ) -> Iterator[tuple[list[bytes | memoryview], list[int]]]:
        """The records of ``runs`` in order, ``_PIECE_RECORDS`` or a few more at a time, and their sizes:
        views into the map, valid while ``txn`` lives, none longer than the file (a damaged length must
        never lead a copy past the file's end)."""
        shard, cursor, piece, position = self._shard, txn.cursor(), list[bytes | memoryview](), 0
        for start, stop in runs:
            for first in range(start, stop, _PIECE_RECORDS):
                last = min(stop, first + _PIECE_RECORDS)
                if not cursor.set_key(_INDEX.pack(first)):
                    raise CorruptShardError.at(shard, "no record under this index", sample_index=first)
                had = len(piece)
                piece += islice(cursor.iternext(keys=False, values=True), last - first)
                if len(piece) - had != last - first or _small(cursor.key()) != _INDEX.pack(last - 1):
                    raise CorruptShardError.at(
                        shard, "records are missing or out of order", sample_index=first
                    )
                if len(piece) >= _PIECE_RECORDS:
                    yield piece, self._sizes(piece, runs, position)
                    position, piece = position + len(piece), []
        if piece:
            yield piece, self._sizes(piece, runs, position)

    def _sizes(
        self, piece: list[bytes | memoryview], runs: Sequence[tuple[int, int]], position: int
    ) -> list[int]:
        """The sizes of ``piece``, the records read from ``position`` on; refuses one longer than the file."""
        sizes = list(map(len, piece))
        if max(sizes) > self._file_size:
            at = next(i for i, size in enumerate(sizes) if size > self._file_size)
            detail = f"record of {sizes[at]:,} bytes"
            raise CorruptShardError.at(self._shard, detail, sample_index=_run_at(runs, position + at)[1])
        return sizes

    def _check_runs(self, runs: Sequence[tuple[int, int]]) -> None:
        shard = self._shard
        if os.getpid() != self._pid:
            raise UsageError(
                f"the LMDB reader of {shard} was created in process {self._pid} and used in {os.getpid()}: "
                "an environment must not cross a fork; create readers in the process that reads"
            )
        if not self._closer.alive:
            raise UsageError(f"the reader of {shard} is closed")
        for start, stop in runs:
            if not 0 <= start <= stop <= self.num_samples:
                detail = f"samples [{start}, {stop}) requested, the shard holds '{self.num_samples}'"
                raise CorruptShardError.at(shard, detail, sample_index=min(max(start, 0), self.num_samples))

    def _decode(self, value: bytes | memoryview, index: int) -> tuple[str, Fields]:
        if len(value) > self._file_size:  # a damaged length: never touch bytes past the file
            raise CorruptShardError.at(self._shard, f"record of {len(value):,} bytes", sample_index=index)
        try:
            return framing.decode(value, version=self._version, check=self._check)
        except framing.FramingError as exc:
            raise CorruptShardError.at(self._shard, str(exc), sample_index=index) from exc

    @staticmethod
    def read_across(
        parts: Sequence[Part], names: Sequence[str], buffer: ReadBuffer, order: np.ndarray | None = None
    ) -> ColumnsOut | None:
        """The records of ``parts`` from several shards of one dataset (readers open in this process), in
        ``order``: one read transaction per shard and every record decoded together
        (:meth:`_decode_parts`); ``None`` for no parts, or shards of different framing versions or checks.
        A method of the reader class, not of one reader: it reads every reader of ``parts``."""
        kinds = {(reader._version, reader._check) for reader, _, _ in parts}
        if len(kinds) != 1:
            return None
        version, check = kinds.pop()
        return LmdbReader._decode_parts(parts, names, buffer, version=version, check=check, order=order)

    @staticmethod
    def _decode_parts(
        parts: Sequence[Part],
        names: Sequence[str],
        buffer: ReadBuffer,
        *,
        version: int,
        check: bool,
        order: np.ndarray | None = None,
    ) -> ColumnsOut:
        """The records of ``parts`` decoded together, in ``order`` (as :meth:`read_across` takes it): one read
        transaction per shard, each shard's runs walked once (a shard's parts next to each other), a bad
        record named by its shard and sample.

        Small records are copied into ``buffer`` a piece at a time as they are walked, and decoded there
        (:func:`framing.decode_joined`), so only a piece's views live at once and the window's bytes land in
        memory already used (a fresh buffer per window costs a page fault per 4 KiB). Large ones, as the first
        piece shows them, are decoded where they lie (:func:`framing.decode_many`).
        """
        joined, sizes, end = buffer.view(0), list[int](), 0
        views: list[bytes | memoryview] = []
        with ExitStack() as stack:
            txns: dict[LmdbReader, lmdb.Transaction] = {}
            for reader, group in groupby(parts, key=lambda part: part[0]):
                runs = [(start, stop) for _, start, stop in group]
                reader._check_runs(runs)
                try:
                    if reader not in txns:
                        txns[reader] = stack.enter_context(reader._env.begin(buffers=True))
                    for piece, lengths in reader._pieces(txns[reader], runs):
                        size = sum(lengths)
                        if views or not (sizes or framing.worth_joining(len(piece), size)):
                            views += piece
                            continue
                        start, end = end, end + size
                        joined = buffer.view(end, keep=start)
                        joined[start:end] = b"".join(piece)
                        sizes += lengths
                except lmdb.Error as exc:
                    raise CorruptShardError.at(
                        reader._shard, f"LMDB: {exc}", sample_index=runs[0][0]
                    ) from exc
            try:
                if sizes:
                    return framing.decode_joined(
                        joined, sizes, names, version=version, check=check, order=order
                    )
                return framing.decode_many(views, names, version=version, check=check, order=order)
            except framing.RecordError as exc:
                run, sample = _run_at(((start, stop) for _, start, stop in parts), exc.position)
                raise CorruptShardError.at(parts[run][0]._shard, str(exc), sample_index=sample) from exc

    def scan(self) -> tuple[list[str], list[SampleLayout], int]:
        """Decode (and check) every record in key order, as the writer's ``close()`` describes them."""
        shard = self._shard
        keys: list[str] = []
        layouts: list[SampleLayout] = []
        try:
            with self._env.begin(buffers=True) as txn:
                for raw_key, value in txn.cursor():
                    raw = _small(raw_key)
                    if raw in (COUNT_KEY, VERSION_KEY):
                        continue
                    if raw != _INDEX.pack(len(keys)):
                        detail = f"unexpected key {raw!r}"
                        raise CorruptShardError.at(shard, detail, sample_index=len(keys))
                    key, fields = self._decode(value, len(keys))
                    layouts.append(SampleLayout(len(keys), None, dict.fromkeys(fields)))
                    keys.append(key)
        except lmdb.Error as exc:
            raise CorruptShardError.at(shard, f"LMDB: {exc}", sample_index=len(keys)) from exc
        if self.num_samples != len(keys):
            detail = f"{COUNT_KEY!r} says {self.num_samples}, found {len(keys)} records"
            raise CorruptShardError.at(shard, detail)
        return keys, layouts, len(keys)


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
            reader._check_runs(its_runs)
        self._records_at = [(slot[reader], i) for reader, start, stop in parts for i in range(start, stop)]
        """``(reader, record)`` of each position in read order."""
        self._names, self._version, self._check = tuple(names), version, check
        self._one_by_one = one_by_one

    def land(self, order: np.ndarray, pool: BufferPool) -> ColumnsOut:
        if not len(order):
            return [], {name: [] for name in self._names}
        if self._one_by_one:
            picks = [self._records_at[i] for i in order.tolist()]
            return columns_of(_read_samples(dict(enumerate(self._readers)), picks, self._names), self._names)
        with self._records(order) as (views, locate):
            spans = framing.record_spans(views, self._names, version=self._version, check=self._check)
            landed = lands(spans.starts, spans.stops) if spans is not None else None
            if spans is not None and landed is not None and landed.any():
                return land(spans, self._names, landed, pool, locate)
            try:  # copies every field out, and names the first damaged record
                return framing.decode_many(views, self._names, version=self._version, check=self._check)
            except framing.RecordError as exc:
                shard, sample = locate(exc.position)
                raise CorruptShardError.at(shard, str(exc), sample_index=sample) from exc

    @contextmanager
    def located(self, order: np.ndarray) -> Iterator[Located | None]:
        with self._records(order) as (views, locate):
            spans = framing.record_spans(views, self._names, version=self._version, check=self._check)
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
            return readers[reader_of[i]]._shard, sample_of[i]

        with ExitStack() as stack:
            gets = _lookups(stack, {slot: readers[slot] for slot in dict.fromkeys(reader_of)})
            try:
                records = [gets[r](_INDEX.pack(s)) for r, s in zip(reader_of, sample_of, strict=True)]
            except lmdb.Error as exc:
                raise CorruptShardError.at(readers[reader_of[0]]._shard, f"LMDB: {exc}") from exc
            for i, record in enumerate(records):
                if record is None or len(record) > readers[reader_of[i]]._file_size:
                    what = (
                        "no record under this index" if record is None else f"record of {len(record):,} bytes"
                    )
                    raise CorruptShardError.at(readers[reader_of[i]]._shard, what, sample_index=sample_of[i])
            yield cast(list[memoryview], records), locate


def _lookups(stack: ExitStack, readers: Mapping[int, LmdbReader]) -> dict[int, Callable[[bytes], Any]]:
    """Each reader's ``get`` (a record by key, as a view of LMDB's map) through one read transaction,
    closed with ``stack``; each reader checked first (this process's, still open)."""
    gets: dict[int, Callable[[bytes], Any]] = {}
    for slot, reader in readers.items():
        reader._check_runs([])
        gets[slot] = stack.enter_context(reader._env.begin(buffers=True)).get
    return gets


def _read_samples(
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
                record = gets[shard](_INDEX.pack(i))
            except lmdb.Error as exc:
                raise CorruptShardError.at(readers[shard]._shard, f"LMDB: {exc}", sample_index=i) from exc
            if record is None:
                detail = "no record under this index"
                raise CorruptShardError.at(readers[shard]._shard, detail, sample_index=i)
            key, fields = readers[shard]._decode(record, i)
            sample: dict[str, Any] = fields
            if len(fields) != len(names):  # a record holds every field of the split, as a rule
                sample = {name: fields[name] for name in names if name in fields}
            sample["__key__"] = key
            out.append(sample)
    return out


class LmdbFormat(FormatBase, format_name="lmdb"):
    def open_writer(self, path: Path) -> LmdbWriter:
        return LmdbWriter(path)

    def open_reader(
        self,
        path: Path,
        index: Offsets | None = None,
        *,
        check: bool = True,
        remote: RemoteBytes | None = None,
    ) -> LmdbReader:
        if remote is not None:
            raise UsageError(
                f"LMDB shard {remote.name} cannot be read by byte ranges (LMDB maps a local file); read it "
                "through the cache (cache=True)"
            )
        return LmdbReader(path, index, check=check)

    def read_across(
        self,
        parts: Sequence[tuple[ShardReader, int, int]],
        names: Sequence[str],
        buffer: ReadBuffer,
        order: np.ndarray | None = None,
    ) -> ColumnsOut | None:
        return LmdbReader.read_across(cast(Sequence[Part], parts), names, buffer, order)

    def locate(
        self,
        parts: Sequence[tuple[ShardReader, int, int]],
        names: Sequence[str],
        *,
        any_size: bool = False,
        scattered: bool = False,
    ) -> LmdbWindow | None:
        records = cast(Sequence[Part], parts)
        kinds = {(reader._version, reader._check) for reader, _, _ in records}
        if len(kinds) != 1:
            return None
        if scattered:
            version, check = kinds.pop()
            return LmdbWindow(records, names, version=version, check=check, one_by_one=True)
        reader, start, _ = records[0]
        reader._check_runs([])
        with reader._env.begin(buffers=True) as txn:
            first = txn.get(_INDEX.pack(start))
            if first is None or (len(first) < LANDED_MIN_BYTES and not any_size):
                return None  # too small to gain (or missing: the general path names it)
        version, check = kinds.pop()
        return LmdbWindow(records, names, version=version, check=check)

    def read_samples(
        self, readers: Mapping[int, ShardReader], picks: Sequence[tuple[int, int]], names: Sequence[str]
    ) -> list[dict[str, Any]] | None:
        return _read_samples(cast(Mapping[int, LmdbReader], readers), picks, names)

    def scan(self, path: Path) -> tuple[list[str], list[SampleLayout], int]:
        with LmdbReader(path) as reader:
            return reader.scan()


Part = tuple[LmdbReader, int, int]
"""Samples ``[start, stop)`` of the shard a reader has open."""


FORMAT = LmdbFormat()
