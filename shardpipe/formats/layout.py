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
against its manifest sha256 and for spans inside their samples before anyone slices with it.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from shardpipe.errors import CorruptShardError, DataError
from shardpipe.formats.base import INDEX_VERSION, ColumnsOut
from shardpipe.formats.bytecolumn import ByteColumn, gather, texts

INDEX_VERSIONS = (1, 2)
checksum = xxhash.xxh3_64_intdigest
"""The per-sample checksum named by ``CHECKSUM_NAME``."""
NO_SPAN = 2**64 - 1
PARSE = 2**64 - 2
OFFSET, KEY_START, KEY_STOP, CHECKSUM = 0, 1, 2, 3
Span = tuple[int, int]


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
        try:
            data = Path(path).read_bytes()
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


Rows = list[list[int]]
"""Index rows ``start..stop`` inclusive as Python ints (:meth:`ShardIndex.rows`): one numpy call per span,
then plain Python, which is what a span of a few samples can afford."""


def check_spans(view: memoryview, rows: Rows, start: int, base: int, shard: str) -> None:
    """Raise naming the first sample of ``rows`` (sample ``start`` first; ``view`` holds the file from byte
    ``base``) whose bytes differ from its checksum. ``rows`` must come from a version-2 index."""
    for i in range(len(rows) - 1):
        row, a = rows[i], rows[i][OFFSET] - base
        if checksum(view[a : rows[i + 1][OFFSET] - base]) != row[CHECKSUM]:
            raise CorruptShardError.at(
                shard, "sample bytes differ from their checksum", sample_index=start + i, offset=base + a
            )


def is_plain(rows: Rows) -> bool:
    """Whether all samples of ``rows`` can be sliced by their spans (none needs the parser)."""
    return all(row[KEY_START] != PARSE for row in rows[:-1])


def cut_samples(
    view: memoryview, rows: Rows, index: ShardIndex, start: int, base: int, shard: str
) -> list[tuple[str, dict[str, bytes]]]:
    """Slice the keys and fields of ``rows``' samples (sample ``start`` first) out of ``view``, which holds
    the file from ``base``. The spans were checked to lie inside their samples when the index was loaded
    or built."""
    columns = [(name, index.first_field + 2 * j) for j, name in enumerate(index.fields)]
    out = []
    for i in range(len(rows) - 1):
        row = rows[i]
        sample: dict[str, bytes] = {}
        for name, column in columns:
            if (a := row[column]) != NO_SPAN:
                sample[name] = view[a - base : row[column + 1] - base].tobytes()
        try:
            key = str(view[row[KEY_START] - base : row[KEY_STOP] - base], "utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptShardError.at(shard, f"key is not UTF-8: {exc}", sample_index=start + i) from None
        out.append((key, sample))
    return out


ColumnSpecs = list[tuple[list[bytes | None], int]]


def column_specs(index: ShardIndex, fields: dict[str, list[bytes | None]]) -> ColumnSpecs:
    """``(values, start column)`` per field of ``fields``: what :func:`cut_columns` appends to."""
    return [(fields[name], index.first_field + 2 * index.fields.index(name)) for name in fields]


def cut_columns(
    view: memoryview, rows: Rows, columns: ColumnSpecs, start: int, base: int, shard: str, keys: list[str],
) -> None:  # fmt: skip
    """Append the keys and the field values (``columns``, from :func:`column_specs`) of ``rows``' samples
    (sample ``start`` first), sliced out of ``view`` (the file from ``base``) as :func:`cut_samples` does,
    without a dict per sample; a field a sample lacks is ``None``."""
    for i in range(len(rows) - 1):
        row = rows[i]
        try:
            keys.append(str(view[row[KEY_START] - base : row[KEY_STOP] - base], "utf-8"))
        except UnicodeDecodeError as exc:
            raise CorruptShardError.at(shard, f"key is not UTF-8: {exc}", sample_index=start + i) from None
        for values, column in columns:
            a = row[column]
            values.append(None if a == NO_SPAN else view[a - base : row[column + 1] - base].tobytes())


def cut_rows(
    view: memoryview, rows: np.ndarray, shift: np.ndarray, ends: np.ndarray, index: ShardIndex,
    names: Sequence[str], verified: bool, locate: Callable[[int], tuple[str, int]],
    order: np.ndarray | None = None,
) -> ColumnsOut:  # fmt: skip
    """Keys and field columns of samples whose index ``rows`` (laid out as ``index``'s) lie in ``view``
    at their file offsets plus ``shift``, each ending at ``ends`` in ``view``: what :func:`check_spans`
    and :func:`cut_columns` give run by run, by index arithmetic, in ``order`` (positions among
    ``rows``; all in turn when ``None``). ``locate(i)`` names row i's shard and sample for an error."""

    def corrupt(i: int, detail: str, offset: int | None = None) -> CorruptShardError:
        shard, sample = locate(i)
        return CorruptShardError.at(shard, detail, sample_index=sample, offset=offset)

    def at(column: int) -> np.ndarray:  # a column's offsets in ``view``
        offsets: np.ndarray = rows[:, column].astype(np.int64) + shift
        return offsets

    if verified and len(rows):
        begin = at(OFFSET).tolist()
        sums = np.fromiter(
            (checksum(view[a:b]) for a, b in zip(begin, ends.tolist(), strict=True)), np.uint64, len(rows)
        )
        bad = np.flatnonzero(sums != rows[:, CHECKSUM])
        if len(bad):
            i = int(bad[0])
            raise corrupt(i, "sample bytes differ from their checksum", int(rows[i, OFFSET]))
    keys = texts(view, at(KEY_START), at(KEY_STOP), order)
    if keys is None:
        keys = []
        for i, row in enumerate(rows.tolist()):  # the first key that fails, named
            span = view[row[KEY_START] + int(shift[i]) : row[KEY_STOP] + int(shift[i])]
            try:
                keys.append(str(span, "utf-8"))
            except UnicodeDecodeError as exc:
                raise corrupt(i, f"key is not UTF-8: {exc}") from None
        keys = keys if order is None else [keys[i] for i in order.tolist()]
    fields: dict[str, ByteColumn] = {}
    for name in names:
        column = index.first_field + 2 * index.fields.index(name)
        present = rows[:, column] != NO_SPAN
        fields[name] = gather(view, at(column), at(column + 1), None if present.all() else present, order)
    return keys, fields


def add_samples(
    keys: list[str], fields: dict[str, list[bytes | None]], samples: Iterable[tuple[str, dict[str, bytes]]]
) -> None:
    """Append ``(key, fields)`` samples to columns; a field a sample lacks is ``None``."""
    for key, sample in samples:
        keys.append(key)
        for name, values in fields.items():
            values.append(sample.get(name))
