"""The shard formats' interface: the protocols every format implements, and the facts the registry keeps.

Each format module holds its writer and its reader. A writer appends samples to one shard file and, on
close, returns where each sample, its key and each field sit, with each sample's checksum (a
``ShardIndex``), which the pack stage writes beside the shard. A reader opens one shard once and yields the
samples of any span ``[start, stop)``: with a ``ShardIndex`` it slices them out of one read; with plain
sample offsets it parses them. Every sample is checked against its checksum unless the caller opts out
(``check=False``) or the shard predates checksums. Readers hold a file or a mapping: create them in the
process that reads (never before a fork) and close them. Nothing read from a shard is ever unpickled.

The interface stands on the leaves :mod:`.terms` and :mod:`.readbuffer` and names the index's types
(:mod:`.layout`); none of them imports it back.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

from shardpipe.errors import UsageError
from shardpipe.formats.readbuffer import ReadBuffer
from shardpipe.formats.terms import Column, ColumnsOut, Fields

if TYPE_CHECKING:  # the CLI imports the registry for the format names: keep numpy out of its start-up
    import numpy as np

    from shardpipe.formats.landing import Landing
    from shardpipe.formats.layout import SampleLayout, ShardIndex

Offsets: TypeAlias = "ShardIndex | Sequence[int] | np.ndarray"
"""A shard's index, or just its ``num_samples + 1`` sample offsets (then the reader parses)."""

WRITE_BUFFER = 1 << 18
"""Writers' file buffer: large enough to batch small writes; larger sizes measured no faster."""


class ShardWriter(Protocol):
    def write(self, key: str, fields: Mapping[str, bytes]) -> None:
        """Append one sample."""

    def write_batch(self, keys: Sequence[str], names: Sequence[str], columns: Sequence[Column]) -> None:
        """Append samples ``keys[i]`` with fields ``names[j] = columns[j][i]``: the pack stage's path,
        which works out per-field framing once per batch instead of once per sample."""

    def close(self) -> ShardIndex:
        """Flush and close; return where each sample, its key and each field sit, and the end offset."""

    def abort(self) -> None:
        """Release the file after a failure; the caller deletes the partial shard."""


class RemoteBytes(Protocol):
    """A remote shard read by byte ranges (``shardpipe.storage``): for sparse reads without a local copy."""

    @property
    def name(self) -> str:
        """Where the bytes live, for error messages (no credentials)."""

    @property
    def size(self) -> int:
        """The object's size, as the manifest records it."""

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``[start, stop)``, fetched with neighbouring ranges coalesced."""


class ShardReader(Protocol):
    """One shard opened once; ``read`` may be called for many spans. Not to be shared across a fork."""

    def read(self, start: int, stop: int) -> Iterator[tuple[str, Fields]]:
        """Yield ``(key, fields)`` for samples ``start <= i < stop``, each checked against its checksum
        unless the reader was opened with ``check=False``.

        Raises :class:`~shardpipe.errors.CorruptShardError` naming the shard and the sample.
        """

    def read_runs(self, runs: Sequence[tuple[int, int]], names: Sequence[str]) -> ColumnsOut:
        """The samples of each run ``[start, stop)``, in order, as columns (checked like ``read``), with
        no object per sample."""

    def close(self) -> None:
        """Release the file or mapping; idempotent (also done when the reader is dropped)."""

    def __enter__(self) -> ShardReader: ...

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: Any) -> None: ...


class Format(Protocol):
    name: str
    """Registry name, as given to ``--format``."""
    suffix: str
    """Shard file suffix, e.g. ``.tar``."""
    needs_index: bool
    """Whether readers need the per-sample byte offsets to seek (LMDB seeks by key instead)."""

    def open_writer(self, path: Path) -> ShardWriter:
        """Start a shard at ``path`` (the caller renames it into place when complete)."""

    def open_reader(
        self, path: Path, index: Offsets | None, *, check: bool = True, remote: RemoteBytes | None = None
    ) -> ShardReader:
        """Open the shard at ``path`` for reading spans; ``index`` is its ``ShardIndex`` (or plain sample
        offsets, then the reader parses; LMDB needs neither). ``check=False`` skips the per-sample checks.
        With ``remote``, the bytes come by range requests instead of from a local file (formats read by
        byte offset only; LMDB needs a local file).

        Raises :class:`~shardpipe.errors.DataError` when the file is missing or shorter than its index.
        """

    def read(
        self, path: Path, start: int, stop: int, offsets: Offsets | None, *, check: bool = True
    ) -> Iterator[tuple[str, Fields]]:
        """Yield ``(key, fields)`` for samples ``start <= i < stop`` of the shard at ``path``: a reader
        opened for one span. Prefer :meth:`open_reader` to read many spans."""

    def locate(
        self,
        parts: Sequence[tuple[ShardReader, int, int]],
        names: Sequence[str],
        buffer: ReadBuffer,
        *,
        any_size: bool = False,
        scattered: bool = False,
    ) -> Landing | None:
        """Where the samples of ``parts`` (a loader's window, in read order, from readers open in this
        process, kept open) lie, with the cost of a call paid once for all their shards; the window is then
        landed in the order it is handed out, whole or a piece at a time (:mod:`~shardpipe.formats.landing`).
        Large samples are landed straight into their batches' columns; small ones are read into ``buffer``
        (reused between calls: valid until the next) and gathered together; with ``any_size`` (a
        mixture's window) every size lands. ``scattered`` samples (random access: a few here and there) are
        read one by one. ``None`` when the readers cannot (read them reader by reader, ``read_runs``).

        Raises :class:`~shardpipe.errors.CorruptShardError` naming the shard and the sample.
        """

    def read_samples(
        self, readers: Mapping[int, ShardReader], picks: Sequence[tuple[int, int]], names: Sequence[str]
    ) -> list[dict[str, Any]] | None:
        """Each ``(shard, sample)`` of ``picks`` (``readers[shard]`` its reader, open in this process;
        repeats allowed) as a dict of its fields of ``names`` (``bytes``; a field it lacks left out) and
        its ``__key__``: random gets, each sample read on its own with nothing built per batch, so that
        per sample the read is all they cost. ``None`` when the readers cannot (read them as a window).

        Raises :class:`~shardpipe.errors.CorruptShardError` naming the shard and the sample.
        """

    def scan(self, path: Path) -> tuple[list[str], list[SampleLayout], int]:
        """Parse every record; return keys, layouts and the end offset, as the writer's ``close()`` does.

        Raises :class:`~shardpipe.errors.CorruptShardError` naming the position of the first bad record.
        """


@dataclass(frozen=True, slots=True)
class FormatInfo:
    """What is known of a format without importing it: its name, file suffixes and index needs."""

    name: str
    suffixes: tuple[str, ...]
    """File suffixes of its shards: the first is what ``pack`` writes; ``index`` adopts them all."""
    needs_index: bool
    """Whether readers need the per-sample byte offsets to seek (LMDB seeks by key instead)."""

    @property
    def suffix(self) -> str:
        return self.suffixes[0]


FORMAT_INFO = {
    info.name: info
    for info in (
        FormatInfo("lmdb", (".lmdb",), needs_index=False),
        FormatInfo("tar", (".tar",), needs_index=True),
        FormatInfo("tfrecord", (".tfrecord", ".tfrecords", ".tfr"), needs_index=True),
    )
}


R = TypeVar("R", bound="ReaderBase")


def check_open(closer: weakref.finalize[Any, Any], shard: str) -> None:
    """Raise unless the reader ``closer`` releases is still open: the one place that says a reader is
    closed (a memory map of its file keeps ``closer``, not the reader)."""
    if not closer.alive:
        raise UsageError(f"the reader of {shard} is closed")


class ReaderBase:
    """The lifetime every shard reader shares: ``_closer`` (a ``weakref.finalize`` the reader sets up)
    releases its file or mapping, on ``close()`` or when the reader is dropped."""

    shard: str
    """The shard's file or object, for error messages."""
    _closer: weakref.finalize[Any, Any]

    def check_open(self) -> None:
        """Raise unless this reader is still open."""
        check_open(self._closer, self.shard)

    def close(self) -> None:
        self._closer()

    def __enter__(self: R) -> R:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class FormatBase:
    """What every format class shares: the registry's facts (``class TarFormat(FormatBase,
    format_name="tar")``) and reading one span through a reader opened for it."""

    name: str
    suffix: str
    needs_index: bool

    def __init_subclass__(cls, *, format_name: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if format_name:
            info = FORMAT_INFO[format_name]
            cls.name, cls.suffix, cls.needs_index = info.name, info.suffix, info.needs_index

    def open_reader(
        self, path: Path, index: Offsets | None, *, check: bool = True, remote: RemoteBytes | None = None
    ) -> ShardReader:
        raise NotImplementedError

    def read(
        self, path: Path, start: int, stop: int, offsets: Offsets | None = None, *, check: bool = True
    ) -> Iterator[tuple[str, Fields]]:
        with self.open_reader(path, offsets, check=check) as reader:
            yield from reader.read(start, stop)

    def locate(
        self,
        parts: Sequence[tuple[ShardReader, int, int]],
        names: Sequence[str],
        buffer: ReadBuffer,
        *,
        any_size: bool = False,
        scattered: bool = False,
    ) -> Landing | None:
        return None

    def read_samples(
        self, readers: Mapping[int, ShardReader], picks: Sequence[tuple[int, int]], names: Sequence[str]
    ) -> list[dict[str, Any]] | None:
        return None
