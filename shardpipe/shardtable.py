"""A split's shard table: one row per shard (path, counts, checksums), held as Arrow columns.

A split of up to :data:`LISTED_SHARDS` shards is written inside ``manifest.json`` as a list, readable by
eye and by every release; a larger one is written beside it as an Arrow IPC file that the manifest names
with its sha256. Loading that file costs one pass of hashing and a memory map, not a Python object per
shard, and the mapped pages are shared by every process on the node. Either way the loaders get the same
object: the counts as int64 arrays for planning, and a shard's whole entry (:class:`ShardEntry`) built and
checked when the shard is opened.

Part of the shared core (see ``shardpipe.manifest``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

LISTED_SHARDS = 2048
"""The most shards a split lists inside ``manifest.json``; a larger split's table is its own file."""
TABLE_SUFFIX = ".shards.arrow"
KEPT_ROWS = 4096
"""Shard entries a table keeps built (all dropped when full): a reader asks for the same few shards again
and again, and building one from its columns costs far more than a dict lookup."""
SCHEMA = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("samples", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("index_path", pa.string()),
        pa.field("index_sha256", pa.string()),
        pa.field("keys_xxh3", pa.string()),
        pa.field("compressed", pa.map_(pa.string(), pa.list_(pa.int64(), 2))),
    ]
)


@dataclass(frozen=True, slots=True)
class ShardEntry:
    path: str
    """Relative to the dataset root, with ``/`` separators."""
    num_samples: int
    num_bytes: int
    sha256: str
    index_path: str | None = None
    index_sha256: str | None = None
    keys_checksum: str | None = None
    """xxh3_64 of the shard's keys in order (``shardpipe.formats.layout.keys_checksum``): what checks a key
    read alone, as a lookup by key reads them. ``None`` in packs written before it was recorded."""
    compressed: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Each compressed field's bytes in this shard, as given and as stored: what ``inspect`` reports."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "samples": self.num_samples,
            "bytes": self.num_bytes,
            "sha256": self.sha256,
        }
        if self.index_path is not None:
            out["index"] = {"path": self.index_path, "sha256": self.index_sha256}
        if self.keys_checksum is not None:
            out["keys_xxh3"] = self.keys_checksum
        if self.compressed:
            out["compressed"] = {name: list(sizes) for name, sizes in self.compressed.items()}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardEntry:
        """Parse and check one shard entry; raises ``ValueError`` saying which entry is wrong."""
        expect(data, dict, "a shard entry")
        index = data.get("index")
        path = expect(data["path"], str, "a shard path")
        where = f"shard {path!r}"
        if index is not None:
            expect(index, dict, f"{where}: index")
            expect(index["path"], str, f"{where}: index path")
            expect(index["sha256"], str, f"{where}: index sha256")
        return cls(
            path=path,
            num_samples=count(data["samples"], f"{where}: samples"),
            num_bytes=count(data["bytes"], f"{where}: bytes"),
            sha256=expect(data["sha256"], str, f"{where}: sha256"),
            index_path=None if index is None else index["path"],
            index_sha256=None if index is None else index["sha256"],
            keys_checksum=data.get("keys_xxh3"),
            compressed={
                name: (count(sizes[0], f"{where}: compressed"), count(sizes[1], f"{where}: compressed"))
                for name, sizes in expect(data.get("compressed", {}), dict, f"{where}: compressed").items()
            },
        ).checked()

    def checked(self) -> ShardEntry:
        """This entry, if its paths stay inside the dataset and its key checksum is well formed; raises
        ``ValueError`` naming the shard."""
        where = f"shard {self.path!r}"
        check_inside(self.path, where)
        if self.index_path is not None:
            check_inside(self.index_path, f"{where}: index")
        if self.keys_checksum is not None and not re.fullmatch("[0-9a-f]{16}", self.keys_checksum):
            raise ValueError(f"{where}: keys_xxh3 is {self.keys_checksum!r:.60}, expected 16 hex digits")
        return self


class ShardTable(Sequence[ShardEntry]):
    """The shards of a split, in order: a sequence of :class:`ShardEntry` over Arrow columns, with the
    counts as arrays (:attr:`num_samples`, :attr:`num_bytes`) and the paths as a sequence of strings
    (:attr:`paths`), none of which builds an object per shard; an entry is built when asked for, and kept
    while few are."""

    __slots__ = ("_encoded", "_rows", "_table", "num_bytes", "num_samples", "paths")

    def __init__(self, table: pa.Table) -> None:
        if not table.schema.equals(SCHEMA):
            raise ValueError(f"the shard table's columns are {table.schema.names}, expected {SCHEMA.names}")
        self._table = table  # a mixture's sources stay chunks of their own (memory-mapped ones unread)
        for name in ("path", "samples", "bytes", "sha256"):
            if self._table.column(name).null_count:
                raise ValueError(f"the shard table has shards without {name}")
        self.num_samples: np.ndarray = _counts(self._table, "samples")
        self.num_bytes: np.ndarray = _counts(self._table, "bytes")
        self.paths: Sequence[str] = _Paths(self)
        self._encoded: bytes | None = None
        self._rows: dict[int, ShardEntry] = {}

    @classmethod
    def of(cls, entries: Iterable[ShardEntry]) -> ShardTable:
        rows = list(entries)
        columns = {
            "path": [e.path for e in rows],
            "samples": [e.num_samples for e in rows],
            "bytes": [e.num_bytes for e in rows],
            "sha256": [e.sha256 for e in rows],
            "index_path": [e.index_path for e in rows],
            "index_sha256": [e.index_sha256 for e in rows],
            "keys_xxh3": [e.keys_checksum for e in rows],
            "compressed": [[(name, list(sizes)) for name, sizes in e.compressed.items()] for e in rows],
        }
        return cls(pa.table(columns, schema=SCHEMA))

    @classmethod
    def decode(cls, data: pa.Buffer | pa.NativeFile) -> ShardTable:
        """The table in an Arrow IPC file (its bytes, or a memory map: read in place); ``ValueError`` when
        it is not one, or holds negative counts or missing values."""
        try:
            table = pa.ipc.open_file(data).read_all()
        except pa.ArrowInvalid as exc:
            raise ValueError(f"the shard table is not an Arrow IPC file: {exc}") from None
        shards = cls(table)
        for name, values in (("samples", shards.num_samples), ("bytes", shards.num_bytes)):
            if values.size and values.min() < 0:
                raise ValueError(f"shard {shards.paths[int(values.argmin())]!r}: {name} is negative")
        return shards

    def encode(self) -> bytes:
        """The table as an Arrow IPC file: the same bytes for the same shards."""
        if self._encoded is None:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_file(sink, SCHEMA) as writer:
                writer.write_table(self._table)
            self._encoded = sink.getvalue().to_pybytes()
        return self._encoded

    def sha256(self) -> str:
        return hashlib.sha256(self.encode()).hexdigest()

    @staticmethod
    def concat(tables: Sequence[ShardTable]) -> ShardTable:
        """The shards of ``tables`` one after another (a mixture's sources)."""
        return ShardTable(pa.concat_tables([t._table for t in tables]) if tables else SCHEMA.empty_table())

    @property
    def listed(self) -> bool:
        """Whether the manifest lists these shards itself (else they go in a table file)."""
        return len(self) <= LISTED_SHARDS

    def first_without_index(self) -> str | None:
        """The path of the first shard that names no index, if any."""
        if not self._table.column("index_path").null_count:
            return None
        return str(self.paths[pc.index(pc.is_null(self._table.column("index_path")), True).as_py()])

    def compressed_bytes(self, name: str) -> tuple[int, int] | None:
        """Field ``name``'s bytes over these shards, as given and as stored; ``None`` where a shard does not
        record them."""
        found = pc.map_lookup(self._table.column("compressed"), pa.scalar(name), "first")
        if found.null_count:
            return None
        sizes = pc.list_flatten(found).to_numpy().reshape(-1, 2)
        return int(sizes[:, 0].sum()), int(sizes[:, 1].sum())

    def __len__(self) -> int:
        return int(self._table.num_rows)

    @overload
    def __getitem__(self, index: int) -> ShardEntry: ...
    @overload
    def __getitem__(self, index: slice) -> ShardTable: ...
    def __getitem__(self, index: int | slice) -> ShardEntry | ShardTable:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise ValueError("a shard table slices with step 1 only")
            return ShardTable(self._table.slice(start, stop - start))
        if (entry := self._rows.get(index)) is not None:  # the usual call: a shard read a moment ago
            return entry
        size = len(self)
        if not -size <= index < size:
            raise IndexError(f"shard {index} of {size}")
        if len(self._rows) >= KEPT_ROWS:
            self._rows.clear()
        entry = self._rows[index] = _entry(self._table.slice(index % size, 1).to_pylist()[0])
        return entry

    def __iter__(self) -> Iterator[ShardEntry]:
        for batch in self._table.to_batches(max_chunksize=4096):
            yield from map(_entry, batch.to_pylist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShardTable):
            return bool(self._table.equals(other._table))
        return isinstance(other, Sequence) and len(other) == len(self) and all(map(_same, self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ShardTable({len(self)} shards, {int(self.num_samples.sum())} samples)"

    def __reduce__(self) -> tuple[Any, ...]:
        return ShardTable, (self._table,)


class _Paths(Sequence[str]):
    """The shards' paths, each read through its table's kept entries."""

    __slots__ = ("_shards",)

    def __init__(self, shards: ShardTable) -> None:
        self._shards = shards

    def __len__(self) -> int:
        return len(self._shards)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._shards[i].path for i in range(*index.indices(len(self)))]
        return self._shards[index].path


def _entry(row: dict[str, Any]) -> ShardEntry:
    return ShardEntry(
        path=row["path"],
        num_samples=row["samples"],
        num_bytes=row["bytes"],
        sha256=row["sha256"],
        index_path=row["index_path"],
        index_sha256=row["index_sha256"],
        keys_checksum=row["keys_xxh3"],
        compressed={name: (sizes[0], sizes[1]) for name, sizes in row["compressed"] or ()},
    ).checked()


def _same(a: ShardEntry, b: object) -> bool:
    return a == b


def _counts(table: pa.Table, name: str) -> np.ndarray:
    """A count column as int64, without a copy where it is one chunk (a memory-mapped file's)."""
    column = table.column(name)
    values = column.chunk(0).to_numpy() if column.num_chunks == 1 else column.to_numpy()
    return np.asarray(values, dtype=np.int64)


def check_inside(path: str, what: str) -> str:
    """``path`` if it names a file inside the dataset (relative, no ``..``); raises ``ValueError``."""
    parts = PurePosixPath(path).parts
    if not parts or path.startswith("/") or ".." in parts or "\\" in path or "\x00" in path:
        raise ValueError(f"{what}: the path {path!r:.80} must be relative inside the dataset")
    return path


def expect(value: Any, kind: type, what: str) -> Any:
    """``value`` if it is a ``kind``; ``TypeError`` naming ``what`` otherwise."""
    if not isinstance(value, kind):
        raise TypeError(f"{what} is {type(value).__name__} {value!r:.60}, expected {kind.__name__}")
    return value


def count(value: Any, what: str) -> int:
    """``value`` if it is an int >= 0; ``ValueError`` naming ``what`` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} is {value!r:.60}, expected a count >= 0")
    return value
