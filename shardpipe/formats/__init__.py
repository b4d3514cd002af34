"""Shard formats behind one small interface, and the registry that names them.

Each format module holds its writer and its reader. A writer appends samples to one shard file and, on
close, returns where each sample, its key and each field sit (a ``ShardIndex``), which the pack stage
writes beside the shard. A reader yields the samples ``[start, stop)`` of one shard: with a ``ShardIndex``
it slices them out of one read; with plain sample offsets it parses them. Nothing read from a shard is
ever unpickled.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from shardpipe.formats.layout import SampleLayout, ShardIndex

Offsets = ShardIndex | Sequence[int] | np.ndarray
"""A shard's index, or just its ``num_samples + 1`` sample offsets (then the reader parses)."""

Fields = dict[str, bytes]
"""A sample's named fields: field name (the file extension, e.g. ``jpg``) -> raw bytes."""


class ShardWriter(Protocol):
    def write(self, key: str, fields: Mapping[str, bytes]) -> None:
        """Append one sample."""

    def write_batch(
        self, keys: Sequence[str], names: Sequence[str], columns: Sequence[Sequence[bytes]]
    ) -> None:
        """Append samples ``keys[i]`` with fields ``names[j] = columns[j][i]``: the pack stage's path,
        which works out per-field framing once per batch instead of once per sample."""

    def close(self) -> ShardIndex:
        """Flush and close; return where each sample, its key and each field sit, and the end offset."""

    def abort(self) -> None:
        """Release the file after a failure; the caller deletes the partial shard."""


class Format(Protocol):
    name: str
    """Registry name, as given to ``--format``."""
    suffix: str
    """Shard file suffix, e.g. ``.tar``."""
    needs_index: bool
    """Whether readers need the per-sample byte offsets to seek (LMDB seeks by key instead)."""

    def open_writer(self, path: Path) -> ShardWriter:
        """Start a shard at ``path`` (the caller renames it into place when complete)."""

    def read(
        self, path: Path, start: int, stop: int, offsets: Offsets | None
    ) -> Iterator[tuple[str, Fields]]:
        """Yield ``(key, fields)`` for samples ``start <= i < stop`` of the shard at ``path``."""

    def scan(self, path: Path) -> tuple[list[str], list[SampleLayout], int]:
        """Parse every record; return keys, layouts and the end offset, as the writer's ``close()`` does.

        Raises :class:`~shardpipe.errors.CorruptShardError` naming the position of the first bad record.
        """


def get_format(name: str) -> Format:
    """Return the format registered under ``name`` (``tar``, ``lmdb`` or ``tfrecord``)."""
    from shardpipe.errors import UsageError

    formats = all_formats()
    if name not in formats:
        raise UsageError(f"unknown format {name!r}; choose one of {', '.join(sorted(formats))}")
    return formats[name]


def all_formats() -> dict[str, Format]:
    from shardpipe.formats import lmdb, tar, tfrecord

    return {f.name: f for f in (tar.FORMAT, lmdb.FORMAT, tfrecord.FORMAT)}
