"""Shard formats behind one small interface, and the registry that names them.

Each format module holds its writer and its reader. A writer appends samples to one shard file and, on
close, returns where each sample, its key and each field sit (a ``ShardIndex``), which the pack stage
writes beside the shard. A reader yields the samples ``[start, stop)`` of one shard: with a ``ShardIndex``
it slices them out of one read; with plain sample offsets it parses them. Nothing read from a shard is
ever unpickled.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, cast

if TYPE_CHECKING:  # the CLI imports this package for the format names: keep numpy out of its start-up
    import numpy as np

    from shardpipe.formats.layout import SampleLayout, ShardIndex

Offsets: TypeAlias = "ShardIndex | Sequence[int] | np.ndarray"
"""A shard's index, or just its ``num_samples + 1`` sample offsets (then the reader parses)."""

Fields = dict[str, bytes]
"""A sample's named fields: field name (the file extension, e.g. ``jpg``) -> raw bytes."""

WRITE_BUFFER = 1 << 18
"""Writers' file buffer. An earlier VM showed write() calls of 1 MiB and more copying into the page cache
up to ~10x slower than 256 KiB ones; on a later one, with ``os.sync()`` between runs in shuffled order,
64 MB took a median 12.0-12.8 ms at every size from 256 KiB to 16 MiB, so the slow cases were write-back
pressure, not the call size. 256 KiB stays: an A/B against 1 MiB was neutral in the pack."""

Column = Sequence[bytes | memoryview]
"""One field's values for a batch of samples; a writer must not keep a ``memoryview`` past the call."""


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


FORMAT_NAMES = ("lmdb", "tar", "tfrecord")


def get_format(name: str) -> Format:
    """Return the format registered under ``name`` (``tar``, ``lmdb`` or ``tfrecord``).

    Only that format's module is imported: a pack pays for its own format's libraries (crc32c alone
    takes ~35 ms to import), not everyone's.
    """
    from shardpipe.errors import UsageError

    if name not in FORMAT_NAMES:
        raise UsageError(f"unknown format {name!r}; choose one of {', '.join(FORMAT_NAMES)}")
    module: Any = importlib.import_module(f"shardpipe.formats.{name}")
    return cast(Format, module.FORMAT)


def all_formats() -> dict[str, Format]:
    return {name: get_format(name) for name in FORMAT_NAMES}
