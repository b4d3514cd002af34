"""Where every sample, key and field sits inside a shard, and each sample's checksum: the index a loader
seeks, slices and checks with.

An index is one little-endian uint64 table per shard of ``num_samples + 1`` rows, versioned through the
manifest (``index_version``):

- version 2: ``[offset, key start, key stop, checksum, start and stop of each manifest field]``;
- version 1: the same without the checksum column.

Positions are absolute byte offsets. The checksum is :func:`checksum` of the sample's whole byte span
``[offset_i, offset_{i+1})``, so one check covers headers, framing, padding and data. The last row holds
the end offset in the offset column and ``NO_SPAN`` elsewhere. A field a sample lacks has ``NO_SPAN``; a
sample whose key or a field is not a plain byte span (a ustar name prefix, a PAX or GNU long name, a
TFRecord int64 list) is marked ``PARSE`` and read by the format's full parser.

Readers take columns through the named accessors, never by position. An index read from disk is checked
against its manifest sha256 and for spans inside their samples before anyone slices with it; the slicing
itself, of samples out of the bytes read, is :mod:`.cutting`'s.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from shardpipe.errors import DataError
from shardpipe.formats.checksums import checksum
from shardpipe.formats.terms import INDEX_VERSION, INDEX_VERSIONS, Span
from shardpipe.storage.files import read_regular


class KeysChecksum:
    """The checksum of a shard's keys in order (xxh3_64 of each key's UTF-8 bytes, length-prefixed), as
    the manifest records it: a key read from its own bytes, without the rest of its sample, is checked by
    it. Fed as the keys are written or read."""

    def __init__(self) -> None:
        self._digest = xxhash.xxh3_64()

    def update(self, keys: Iterable[str | bytes]) -> None:
        for key in keys:
            raw = key.encode() if isinstance(key, str) else key
            self._digest.update(len(raw).to_bytes(4, "little"))
            self._digest.update(raw)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def keys_checksum(keys: Iterable[str | bytes]) -> str:
    """:class:`KeysChecksum` of ``keys``."""
    digest = KeysChecksum()
    digest.update(keys)
    return digest.hexdigest()


NO_SPAN = 2**64 - 1
PARSE = 2**64 - 2
OFFSET, KEY_START, KEY_STOP, CHECKSUM = 0, 1, 2, 3


def fixed_columns(version: int) -> int:
    """Columns before the field spans."""
    return 3 if version == 1 else 4


def index_bytes(num_samples: int, num_fields: int, version: int) -> int:
    """The size of an index file: ``num_samples + 1`` rows of uint64."""
    return (num_samples + 1) * (fixed_columns(version) + 2 * num_fields) * 8


@dataclass(frozen=True, slots=True)
class SampleLayout:
    offset: int
    """Byte offset where the sample starts."""
    key: Span | None
    """Span of the key's UTF-8 bytes; ``None`` when only parsing finds the key."""
    fields: dict[str, Span | None]
    """Span of each field's bytes; ``None`` when the field is present but not a plain byte span."""


class ShardIndex:
    """A shard's index table; also a sequence of its ``num_samples + 1`` sample offsets."""

    def __init__(self, table: np.ndarray, fields: Sequence[str], *, version: int = INDEX_VERSION) -> None:
        if version not in INDEX_VERSIONS:
            raise DataError(
                f"index version {version} is not supported; this shardpipe reads {INDEX_VERSIONS}"
            )
        first = fixed_columns(version)
        if table.ndim != 2 or table.shape[1] != first + 2 * len(fields) or len(table) < 1:
            raise DataError(f"index table of shape {table.shape} does not fit {len(fields)} fields")
        self.table = table
        self.fields = tuple(fields)
        self.version = version
        self.first_field = first
        """Column of the first field's start; field j's span is columns ``first_field + 2j`` and ``+ 1``."""
        self.offsets = table[:, OFFSET]
        """``(num_samples + 1,)``: where each sample starts, then the end offset."""
        self.key_starts = table[:, KEY_START]
        self.key_stops = table[:, KEY_STOP]
        self.checksums = table[:-1, CHECKSUM] if version >= 2 else None
        """``(num_samples,)`` checksums of each sample's span; ``None`` for a version-1 index."""
        self.field_starts = table[:, first::2]
        """``(num_samples + 1, num_fields)``; ``NO_SPAN`` where a sample lacks the field."""
        self.field_stops = table[:, first + 1 :: 2]
        self.all_plain = not bool((table[:-1, KEY_START] == PARSE).any())
        """Whether every sample can be sliced by its spans (no sample needs the format's parser)."""

    def rows(self, start: int, stop: int) -> list[list[int]]:
        """Rows ``start..stop`` inclusive (the last gives the span's end offset) as Python ints."""
        rows: list[list[int]] = self.table[start : stop + 1].tolist()
        return rows

    @property
    def num_samples(self) -> int:
        return len(self.table) - 1

    @property
    def end(self) -> int:
        return int(self.offsets[-1])

    @classmethod
    def build(
        cls,
        layouts: Sequence[SampleLayout],
        end: int,
        fields: Sequence[str],
        checksums: Sequence[int] | np.ndarray | None,
    ) -> ShardIndex:
        """The index of parsed samples; with ``checksums=None`` a version-1 table (no checksum column)."""
        version = 1 if checksums is None else INDEX_VERSION
        first = fixed_columns(version)
        column = {name: first + 2 * j for j, name in enumerate(fields)}
        table = np.full((len(layouts) + 1, first + 2 * len(fields)), NO_SPAN, dtype="<u8")
        for i, sample in enumerate(layouts):
            table[i, OFFSET] = sample.offset
            table[i, KEY_START : KEY_STOP + 1] = PARSE
            plain = sample.key is not None and all(
                span is not None and name in column for name, span in sample.fields.items()
            )
            if plain:
                table[i, KEY_START : KEY_STOP + 1] = sample.key
                for name, span in sample.fields.items():
                    table[i, column[name] : column[name] + 2] = span
        if checksums is not None:
            table[:-1, CHECKSUM] = checksums
        table[-1, OFFSET] = end
        return cls(table, fields, version=version)

    @classmethod
    def from_batches(cls, batches: Sequence[tuple[tuple[str, ...], np.ndarray]], end: int) -> ShardIndex:
        """Assemble a writer's batches, each ``(field names, rows)`` laid out like a version-2 table with
        those names as its fields; the index's fields are the sorted union of every batch's names."""
        first = fixed_columns(INDEX_VERSION)
        fields = sorted({name for names, _ in batches for name in names})
        column = {name: first + 2 * j for j, name in enumerate(fields)}
        num_samples = sum(len(rows) for _, rows in batches)
        table = np.full((num_samples + 1, first + 2 * len(fields)), NO_SPAN, dtype="<u8")
        table[num_samples, OFFSET] = end
        row = 0
        for names, rows in batches:
            last = row + len(rows)
            table[row:last, :first] = rows[:, :first]
            for j, name in enumerate(names):
                table[row:last, column[name] : column[name] + 2] = rows[:, first + 2 * j : first + 2 * j + 2]
            row = last
        return cls(table, fields)

    @classmethod
    def read(
        cls,
        path: Path,
        num_samples: int,
        fields: Sequence[str],
        *,
        version: int = INDEX_VERSION,
        sha256: str | None = None,
    ) -> ShardIndex:
        """Load and check an index file: against ``sha256`` (the manifest's) when given, then its shape
        and that every span lies inside its sample, so no reader ever slices with a damaged index."""
        try:  # never past the size the index must have, and only from a regular file
            data = read_regular(path, index_bytes(num_samples, len(fields), version))
        except OSError as exc:
            raise DataError(f"cannot read index {path}: {exc}") from exc
        return cls.from_bytes(data, num_samples, fields, version=version, sha256=sha256, name=str(path))

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        num_samples: int,
        fields: Sequence[str],
        *,
        version: int = INDEX_VERSION,
        sha256: str | None = None,
        name: str = "index",
    ) -> ShardIndex:
        """An index from its file's bytes (read locally or fetched), checked as :meth:`read` checks it."""
        path = name
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise DataError(
                f"index {path} does not match its sha256 in the manifest (damaged or replaced); "
                "run `shardpipe verify`"
            )
        width = fixed_columns(version) + 2 * len(fields)
        if len(data) != (expected := index_bytes(num_samples, len(fields), version)):
            raise DataError(
                f"index {path} holds {len(data):,} bytes, expected {expected:,} "
                f"({num_samples + 1} rows of {width} uint64); run `shardpipe verify`"
            )
        table = np.frombuffer(data, dtype="<u8").reshape(num_samples + 1, width)
        index = cls(table, fields, version=version)
        if (bad := index.first_bad_sample()) is not None:
            raise DataError(
                f"index {path}: the entry of sample {bad} points outside its sample; run `shardpipe verify`"
            )
        return index

    def first_bad_sample(self) -> int | None:
        """The first sample whose offsets go backwards or whose key or field spans leave the sample."""
        starts, stops = self.offsets[:-1], self.offsets[1:]
        bad = stops < starts
        plain = self.key_starts[:-1] != PARSE
        bad |= plain & ~(
            (starts <= self.key_starts[:-1])
            & (self.key_starts[:-1] <= self.key_stops[:-1])
            & (self.key_stops[:-1] <= stops)
        )
        field_starts, field_stops = self.field_starts[:-1], self.field_stops[:-1]  # (samples, fields)
        present = field_starts != NO_SPAN
        inside = (
            (starts[:, None] <= field_starts)
            & (field_starts <= field_stops)
            & (field_stops <= stops[:, None])
        )
        bad |= (present & ~inside).any(axis=1) & plain
        bad |= ~plain & (present.any(axis=1) | (self.key_stops[:-1] != PARSE))
        hits = np.flatnonzero(bad)
        return int(hits[0]) if len(hits) else None

    def to_bytes(self) -> bytes:
        return self.table.astype("<u8", copy=False).tobytes()

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> int:
        return int(self.offsets[index])

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ShardIndex)
            and self.fields == other.fields
            and self.version == other.version
            and np.array_equal(self.table, other.table)
        )

    __hash__ = None  # type: ignore[assignment]


def span_checksums(
    data: bytes | memoryview, offsets: Sequence[int] | np.ndarray, base: int = 0
) -> np.ndarray:
    """``(len(offsets) - 1,)`` checksums of the spans between consecutive ``offsets``; ``data`` holds the
    file from byte ``base``."""
    view = memoryview(data)
    bounds = [int(x) - base for x in offsets]
    return np.array([checksum(view[a:b]) for a, b in itertools.pairwise(bounds)], dtype="<u8")


def shard_checksums(path: Path, layouts: Sequence[SampleLayout], end: int) -> np.ndarray:
    """The checksum of every scanned sample's span in the shard at ``path``: what ``index`` and ``verify``
    compute from a shard's bytes as they are."""
    with Path(path).open("rb") as f:
        data = f.read(end)
    return span_checksums(data, [sample.offset for sample in layouts] + [end])
