"""Runs of several shards of one dataset (a loader's window) read into one buffer and cut together.

Every run is read end to end into one reused buffer (one ``preadv`` each), then checked and cut by
:func:`~.cutting.cut_rows`, so that per sample only the checksum call remains (keys and fields are
gathered as columns) and what a call costs beyond that is paid once for all runs instead of once per
shard. For the formats read by byte offset (tar, TFRecord); it needs only what :class:`Joinable` names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from shardpipe.errors import CorruptShardError
from shardpipe.formats.cutting import cut_rows
from shardpipe.formats.layout import OFFSET, ShardIndex
from shardpipe.formats.readbuffer import ReadBuffer
from shardpipe.formats.terms import ColumnsOut

JOINED_BYTES = 4 << 20
"""Bytes of all runs of one :func:`read_across` call up to which they are read into one buffer and cut
together."""
JOINED_MIN_SAMPLES = 128
"""Samples a :func:`read_across` call needs before the one-buffer path pays for its fixed cost (a few dozen
numpy calls); fewer go run by run (docs/design.md, "Formats and the index")."""
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


def read_across(
    parts: Sequence[tuple[Joinable, int, int]],
    names: Sequence[str],
    buffer: ReadBuffer,
    order: np.ndarray | None = None,
) -> ColumnsOut | None:
    """The samples ``[start, stop)`` of each part, from any of one dataset's shards, in ``order`` (positions
    in read order; all in turn when ``None``), read into ``buffer`` (grown as needed) and cut together.

    ``None`` (read them another way) when they hold fewer than ``JOINED_MIN_SAMPLES`` samples in fewer than
    ``JOINED_MIN_PARTS`` parts (the fixed cost of a few dozen numpy calls would dominate) or more than
    ``JOINED_BYTES`` (large samples go the chunked way, which keeps each chunk in the CPU cache while it is
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
    view = _read_parts(parts, bases, sizes, buffer)
    counts = np.array([stop - start for _, start, stop in parts], np.int64)
    table = np.concatenate(rows)
    run_of = np.repeat(np.arange(len(parts)), counts)  # each sample's part
    shift, ends = _placed(table, counts, run_of, np.array(bases, np.int64), np.array(sizes, np.int64))
    firsts = np.cumsum(counts) - counts

    def locate(i: int) -> tuple[str, int]:
        run = int(run_of[i])
        reader, start, _ = parts[run]
        return reader.shard, start + i - int(firsts[run])

    first = parts[0][0]
    return cut_rows(
        view,
        table,
        shift=shift,
        ends=ends,
        index=first.sliced_index,
        names=names,
        verified=first.verified,
        locate=locate,
        order=order,
    )


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
