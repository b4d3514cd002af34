"""Writing one shard: the unit of work any executor runs, its result the shard's manifest entry.

:func:`write_shard` takes a planned :class:`~shardpipe.packing.plan.ShardJob`, writes it under a temporary
name, puts its index in place, checksums the shard and publishes it, then returns its
:class:`~shardpipe.manifest.ShardEntry`. Its bytes depend only on the job, so a retry, another worker
or another machine writes the same shard, and a failed or killed write leaves nothing under a final name.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from typing import Any

from shardpipe.errors import DataError
from shardpipe.formats import get_format
from shardpipe.formats.compressor import FieldCompressor
from shardpipe.formats.layout import KeysChecksum
from shardpipe.formats.terms import Column
from shardpipe.packing import tally
from shardpipe.packing.plan import ShardJob, cut_runs
from shardpipe.shardtable import ShardEntry
from shardpipe.sources import SampleTable
from shardpipe.sources.urls import Stores, fetch_cells
from shardpipe.storage import Store, redact_url
from shardpipe.storage.files import sha256_file, start_writeback

BATCH_BYTES = 1 << 20
"""File contents per writer batch: small enough to stay in the CPU cache between the read and the write
(and, for LMDB, its copy into pages; docs/design.md, "The pack stage")."""


class SourceFileError(DataError):
    """A source file could not be read, or no longer has the size the scan found (``changed``)."""

    def __init__(self, message: str, *, path: str = "", changed: bool = False) -> None:
        super().__init__(message)
        self.path, self.changed = path, changed


def write_shard(
    job: ShardJob,
    out: Store,
    format_name: str,
    source_options: Mapping[str, Any] | None = None,
    compressor: FieldCompressor | None = None,
) -> ShardEntry:
    """Write one planned shard into ``out`` (see :func:`write_columns`), its samples read from their
    files or URLs (:func:`load_batches`). Module-level, and its arguments pickle (a store pickles as its
    root and options): any executor runs it."""
    batches = load_batches(job.samples, job.relpath, source_options)
    return write_columns(job.relpath, out, format_name, batches, compressor)


Batch = tuple[Sequence[str], Sequence[str], Sequence[Column]]
"""Samples as a writer takes them: keys, field names, and one column of values per field."""


def write_columns(
    relpath: str,
    out: Store,
    format_name: str,
    batches: Iterable[Batch],
    compressor: FieldCompressor | None = None,
) -> ShardEntry:
    """Write the samples of ``batches`` as the shard ``relpath`` of ``out`` (:class:`ShardFile`)."""
    with ShardFile(relpath, out, format_name, compressor=compressor) as shard:
        for batch in batches:
            shard.write_batch(*batch)
        return shard.finish()


class ShardFile:
    """One shard being written into a store: staged under a temporary name, then its index put in place
    and the shard published (locally a rename; to an object store an upload, read back and checked). The
    writer frames each batch with its per-field work done once. Either :meth:`finish` or :meth:`abort`
    ends it (leaving a ``with`` block without :meth:`finish` aborts it); a shard aborted (or never
    finished) leaves nothing under a final name.

    Samples come as batches (:meth:`write_batch`) or one by one (:meth:`add`, of ``fields``), which are
    gathered into batches by the rule :func:`load_batches` cuts files by (:data:`BATCH_BYTES` of
    payload, a sample at least): the same samples give the same writer calls however they were produced,
    and so the same bytes in formats whose layout follows the calls. A ``compressor`` turns the chosen
    fields' values into frames on their way to the writer (batches are cut by the values' own size)."""

    def __init__(
        self,
        relpath: str,
        out: Store,
        format_name: str,
        fields: Sequence[str] = (),
        *,
        compressor: FieldCompressor | None = None,
    ) -> None:
        self.relpath, self._out, self._format = relpath, out, get_format(format_name)
        self._compressor = compressor
        self.fields = tuple(fields)
        self._stack = ExitStack()
        self._temp = self._stack.enter_context(out.staging(relpath))
        self._writer = self._format.open_writer(self._temp)
        self._rows: list[tuple[Any, ...]] = []  # (key, *values) of the batch being gathered by add()
        self._held = 0
        self._ended = False
        self.num_samples = 0
        self._keys = KeysChecksum()  # the manifest's checksum of the shard's keys
        self._compressed: dict[str, list[int]] = {}  # field -> [bytes given, bytes stored]

    def __enter__(self) -> ShardFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self._ended:
            self.abort()

    def write_batch(self, keys: Sequence[str], names: Sequence[str], columns: Sequence[Column]) -> None:
        self._flush()  # samples added before it go first
        if self._compressor is not None:
            columns = self._compress(names, columns)
        self._writer.write_batch(keys, names, columns)
        self.num_samples += len(keys)
        self._keys.update(keys)
        tally.count(len(keys), sum(len(value) for column in columns for value in column if value is not None))

    def add(self, key: str, values: Sequence[bytes], size: int) -> None:
        """Add one sample: its ``fields``' values in order, and their ``size`` in bytes."""
        if self._rows and self._held + size > BATCH_BYTES:
            self._flush()
        self._rows.append((key, *values))
        self._held += size
        self.num_samples += 1
        self._keys.update((key,))

    def _flush(self) -> None:
        if self._rows:
            keys, *columns = zip(*self._rows, strict=True)
            if self._compressor is not None:
                columns = self._compress(self.fields, columns)  # type: ignore[assignment]
            self._writer.write_batch(keys, self.fields, columns)  # counted as added
            tally.count(len(keys), self._held)
            self._rows, self._held = [], 0

    def _compress(self, names: Sequence[str], columns: Sequence[Column]) -> list[list[Any]]:
        """The compressed fields' values as frames, their sizes before and after counted."""
        assert self._compressor is not None
        out = self._compressor.compress(names, columns)
        for name, given, stored in zip(names, columns, out, strict=True):
            if name in self._compressor.dictionaries:
                sizes = self._compressed.setdefault(name, [0, 0])
                sizes[0] += sum(len(value) for value in given if value is not None)
                sizes[1] += sum(len(value) for value in stored if value is not None)
        return out

    def abort(self) -> None:
        self._ended = True
        with self._stack:  # the staged file goes
            self._writer.abort()

    def finish(self) -> ShardEntry:
        self._ended = True
        with self._stack:
            self._flush()
            index = self._writer.close()
            start_writeback(self._temp)  # overlaps the index and the checksum pass: publishing waits less
            index_path = index_sha256 = None
            if self._format.needs_index:  # in place before the shard: never a shard without its index
                index_path = f"{self.relpath}.idx"
                index_sha256 = self._out.put(index_path, index.to_bytes())
            sha256, num_bytes = sha256_file(self._temp), self._temp.stat().st_size
            self._out.publish(self.relpath, self._temp, sha256)
        keys, sizes = self._keys.hexdigest(), {name: (a, b) for name, (a, b) in self._compressed.items()}
        return ShardEntry(
            self.relpath, self.num_samples, num_bytes, sha256, index_path, index_sha256, keys, sizes
        )


def load_batches(
    samples: SampleTable, where: str, source_options: Mapping[str, Any] | None
) -> Iterator[Batch]:
    """The samples' bytes in batches of about :data:`BATCH_BYTES`, read into one buffer that every batch
    reuses (a worker holds at most one batch of file contents, and no memory is allocated, and
    page-faulted, per file). A batch's values may be views of that buffer: use them before the next.
    URL cells are fetched through the storage seam with ``source_options`` (:mod:`shardpipe.sources.urls`);
    errors name ``where`` (the shard or piece being made)."""
    runs = cut_runs(samples.num_bytes, max_samples=None, max_bytes=BATCH_BYTES)
    buffer = _read_buffer(max(int(samples.sizes[run].sum()) for run in runs))
    stores = Stores(source_options)
    for run in runs:
        batch = samples.take(run)
        yield batch.keys, batch.fields, _load(batch, buffer, where, stores)


_local = threading.local()  # one buffer per thread: an executor may run shards on threads


def _read_buffer(size: int) -> memoryview:
    """This thread's read buffer, grown to ``size`` bytes: every shard the thread writes reuses it, so
    its pages are allocated and faulted in once, not once per shard."""
    buffer: bytearray | None = getattr(_local, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = _local.buffer = bytearray(size)
    return memoryview(buffer)[:size]


def _load(
    batch: SampleTable, buffer: memoryview, shard: str, stores: Stores
) -> list[list[bytes | memoryview]]:
    """The batch's columns: literal bytes as they are, each file read into its slice of ``buffer``.

    A file is read by raw ``os`` calls (``open()`` builds a file object per file, as costly as the
    syscalls for a small sample), with one ``preadv`` of its scanned size plus one spare byte: a file
    that changed since the scan is caught, not packed with a size the plan did not expect. URL cells are
    fetched first, all of the batch's at once.
    """
    sizes = batch.sizes.tolist()  # (samples, fields)
    fetched = _fetch(batch, shard, stores)
    spare = bytearray(1)
    columns: list[list[bytes | memoryview]] = []
    pos = 0
    for j, values in enumerate(batch.columns):
        column: list[bytes | memoryview] = []
        for i, value in enumerate(values):
            if isinstance(value, bytes):
                column.append(value)
                continue
            size = sizes[i][j]
            if (i, j) in fetched:
                column.append(fetched[i, j])
                continue
            view = buffer[pos : pos + size]
            where = f"field {batch.fields[j]!r} of sample {batch.keys[i]!r}, for shard {shard}"
            try:
                fd = os.open(value, os.O_RDONLY)
                try:
                    num_read = os.preadv(fd, [view, spare], 0)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise SourceFileError(f"cannot read {value} ({where}): {exc.strerror}", path=value) from exc
            if num_read != size:
                raise SourceFileError(
                    f"{value} changed while packing: scanned {size:,} bytes, read {num_read:,} ({where})",
                    path=value,
                    changed=True,
                )
            column.append(view)
            pos += size
        columns.append(column)
    return columns


def _fetch(batch: SampleTable, shard: str, stores: Stores) -> dict[tuple[int, int], bytes]:
    """The batch's URL cells, fetched, each checked against its scanned size."""
    cells = [
        (i, j, value)
        for j, values in enumerate(batch.columns)
        for i, value in enumerate(values)
        if isinstance(value, str) and "://" in value
    ]
    if not cells:
        return {}
    fetched = {}
    for (i, j, url), data in zip(cells, fetch_cells((url for _, _, url in cells), stores), strict=True):
        where = f"field {batch.fields[j]!r} of sample {batch.keys[i]!r}, for shard {shard}"
        if isinstance(data, DataError):
            raise SourceFileError(f"cannot read {redact_url(url)} ({where}): {data}", path=redact_url(url))
        size = int(batch.sizes[i, j])
        if len(data) != size:
            raise SourceFileError(
                f"{redact_url(url)} changed while packing: scanned {size:,} bytes, read {len(data):,} "
                f"({where})",
                path=redact_url(url),
                changed=True,
            )
        fetched[i, j] = data
    return fetched
