"""Small samples of several shards of one dataset (a loader's window), read into one buffer and gathered.

Every run is read end to end into one reused buffer (one ``preadv`` each); the index rows then say where
each sample, key and field lies in it (:class:`~.landing.Spans` over the one buffer), and
:func:`~.landing.land` checks them and gathers each field in one take, so that per sample only the
checksum call remains and what a call costs beyond that is paid once for all runs instead of once per
shard. For the formats read by byte offset (tar, TFRecord); it needs only what :class:`Joinable` names.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import numpy as np

from shardpipe.errors import CorruptShardError
from shardpipe.formats.landing import Located, Spans, land
from shardpipe.formats.layout import CHECKSUM, KEY_START, KEY_STOP, OFFSET, ShardIndex
from shardpipe.formats.leases import BufferPool
from shardpipe.formats.readbuffer import ReadBuffer
from shardpipe.formats.terms import ColumnsOut

JOINED_BYTES = 4 << 20
"""Bytes of all runs of one window up to which they are read into one buffer and gathered together."""
JOINED_MIN_SAMPLES = 128
"""Samples a window needs before the one-buffer path pays for its fixed cost (a few dozen numpy calls);
fewer go run by run (docs/design.md, "Formats and the index")."""
JOINED_MIN_PARTS = 32
"""Or the parts it needs: that many runs of one or a few samples (a random-access batch) cost more run by
run than in one buffer (docs/design.md, "Formats and the index")."""


class Joinable(Protocol):
    """A reader whose runs can be read here: a local file whose samples are all sliced by its index."""

    shard: str
    verified: bool
    """Whether each sample's checksum is checked."""

    @property
    def joinable(self) -> bool: ...

    @property
    def sliced_index(self) -> ShardIndex:
        """Its index, which slices every sample."""

    def check_open(self) -> None: ...

    def check_bounds(self, start: int, stop: int) -> None: ...

    def read_into(self, view: memoryview, base: int) -> int:
        """Bytes of the file from ``base`` into ``view``; how many there were."""


def joint_layout(reader: Joinable) -> tuple[object, ...]:
    """What must agree for shards to be cut together: their index columns and whether they are checked."""
    index = reader.sliced_index
    return index.fields, index.first_field, reader.verified


def all_joinable(readers: Sequence[Joinable]) -> bool:
    """Whether every reader is :attr:`~Joinable.joinable` and laid out as the first (raises if one is
    closed)."""
    layout = joint_layout(readers[0]) if readers and readers[0].joinable else None
    if layout is None or not all(r.joinable and joint_layout(r) == layout for r in readers):
        return False
    for reader in readers:
        reader.check_open()
    return True


def join(
    parts: Sequence[tuple[Joinable, int, int]], names: Sequence[str], buffer: ReadBuffer
) -> JoinedWindow | None:
    """The samples ``[start, stop)`` of each part, from any of one dataset's shards, read into ``buffer``
    (grown as needed) to be gathered together; valid until ``buffer`` is read into again.

    ``None`` (read them another way) when they hold fewer than ``JOINED_MIN_SAMPLES`` samples in fewer than
    ``JOINED_MIN_PARTS`` parts (the fixed cost of a few dozen numpy calls would dominate) or more than
    ``JOINED_BYTES`` (larger ones go the chunked way, which keeps each chunk in the CPU cache while it is
    checked and cut), or when the readers cannot be joined (:func:`all_joinable`).

    Raises :class:`~shardpipe.errors.CorruptShardError` naming the shard and the sample.
    """
    few = sum(stop - start for _, start, stop in parts) < JOINED_MIN_SAMPLES
    if not parts or (few and len(parts) < JOINED_MIN_PARTS):
        return None
    if not all_joinable(list(dict.fromkeys(reader for reader, _, _ in parts))):
        return None
    rows, bases, sizes = _spans(parts)
    if sum(sizes) > JOINED_BYTES:
        return None
    return JoinedWindow(parts, names, _read_parts(parts, bases, sizes, buffer), rows, bases, sizes)


class JoinedWindow:
    """Samples of several shards end to end in one buffer, where their index rows say (:func:`join`)."""

    in_pieces = False  # gathered whole: one take per field

    def __init__(
        self,
        parts: Sequence[tuple[Joinable, int, int]],
        names: Sequence[str],
        view: memoryview,
        rows: Sequence[np.ndarray],
        bases: Sequence[int],
        sizes: Sequence[int],
    ) -> None:
        counts = np.array([stop - start for _, start, stop in parts], np.int64)
        table = np.concatenate(rows)
        self._run_of = np.repeat(np.arange(len(parts)), counts)  # each sample's part
        shift, ends = _placed(
            table, counts, self._run_of, np.array(bases, np.int64), np.array(sizes, np.int64)
        )
        self._firsts = np.cumsum(counts) - counts
        self._parts, self._names = parts, tuple(names)
        first = parts[0][0]
        index = first.sliced_index

        def at(column: int) -> np.ndarray:  # a column's offsets in the buffer, -1 where a sample lacks it
            raw = table[:, column].astype(np.int64)
            placed: np.ndarray = np.where(raw >= 0, raw + shift, -1)
            return placed

        columns = [index.first_field + 2 * index.fields.index(name) for name in names]
        self._spans = Spans(
            view,
            at(OFFSET),
            ends,
            table[:, CHECKSUM] if first.verified else None,
            at(KEY_START),
            at(KEY_STOP),
            np.array([at(c) for c in columns], np.int64).T.reshape(len(table), len(columns)),
            np.array([at(c + 1) for c in columns], np.int64).T.reshape(len(table), len(columns)),
            in_file=False,
        )

    def land(self, order: np.ndarray | None, pool: BufferPool | None = None) -> ColumnsOut:
        """The samples at ``order`` (positions in read order; all in turn when ``None``), gathered."""
        return land(self._spans, self._names, self._locate, order=order)

    @contextmanager
    def located(self, order: np.ndarray) -> Iterator[Located | None]:
        yield None  # nothing lands: small samples are gathered

    def _locate(self, i: int) -> tuple[str, int]:
        run = int(self._run_of[i])
        reader, start, _ = self._parts[run]
        return reader.shard, start + i - int(self._firsts[run])


def _placed(
    table: np.ndarray, counts: np.ndarray, run_of: np.ndarray, bases: np.ndarray, sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Where the samples of ``table`` (the parts' index rows: ``counts[p]`` of part p, sample i of part
    ``run_of[i]``, whose bytes ``[bases[p], bases[p] + sizes[p])`` lie end to end in the buffer) lie in the
    buffer: each sample's shift from its file offsets, and where it ends (the next sample of its part, or
    the part's end)."""
    positions = np.cumsum(sizes) - sizes  # where each part starts in the buffer
    shift = (positions - bases)[run_of]
    ends = np.empty(len(table), np.int64)
    ends[:-1] = table[1:, OFFSET].astype(np.int64) + shift[1:]
    nonempty = counts > 0
    ends[np.cumsum(counts)[nonempty] - 1] = (positions + sizes)[nonempty]
    return shift, ends


def _spans(parts: Sequence[tuple[Joinable, int, int]]) -> tuple[list[np.ndarray], list[int], list[int]]:
    """Each part's index rows, the byte its samples start at and their bytes; raises naming the shard of
    a part that asks for samples it does not hold."""
    rows, bases, sizes = [], [], []
    for reader, start, stop in parts:
        index = reader.sliced_index
        offsets = index.offsets
        if not 0 <= start <= stop < len(offsets):
            reader.check_bounds(start, stop)  # raises, naming the shard
        base = offsets.item(start)
        bases.append(base)
        sizes.append(offsets.item(stop) - base)
        rows.append(index.table[start:stop])
    return rows, bases, sizes


def _read_parts(
    parts: Sequence[tuple[Joinable, int, int]], bases: Sequence[int], sizes: Sequence[int], buffer: ReadBuffer
) -> memoryview:
    """Every part's bytes end to end in ``buffer``; a file that ends inside a part names the sample it
    cuts."""
    view, at = buffer.view(sum(sizes)), 0
    for (reader, start, stop), base, size in zip(parts, bases, sizes, strict=True):
        if size and (got := reader.read_into(view[at : at + size], base)) != size:
            offsets = reader.sliced_index.offsets[start : stop + 1]
            cut = start + int(np.searchsorted(offsets, base + got, side="right")) - 1  # the one it cuts
            raise CorruptShardError.at(
                reader.shard, "file ends inside the sample", sample_index=cut, offset=base + got
            )
        at += size
    return view
