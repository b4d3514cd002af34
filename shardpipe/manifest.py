"""The manifest: the only contract between the pack stage and the loaders.

``OUT/manifest.json`` records everything a loader needs to plan an epoch before reading a byte:
per-shard sample counts, sizes and checksums, and, for formats that seek by byte offset, the path and
sha256 of a per-shard index (``shardpipe.formats.layout``: where each sample, key and field sits, and each
sample's checksum). It holds no timestamps, so the same input and options give a byte-identical manifest.

Version 2 adds ``index_version`` (the index's column layout), ``sample_checksum`` (the per-sample checksum
every reader checks) and ``content_sha256``, a digest of the rest of the manifest, so that damage to the
manifest itself (a field name, a count) is an error, not silently different data. The digest detects
accidental damage; it is no signature: whoever edits a manifest by hand can recompute it. Version 3 adds
``requires``, the features a reader must know to read the pack (``compression``): a reader refuses a
feature it does not know, and releases that read only version 2 refuse the pack whole, instead of
returning stored bytes they cannot decode. A pack that needs no feature is still written as version 2.
A split of more than ``LISTED_SHARDS`` shards keeps its shards in a file of its own, an Arrow table
(:mod:`shardpipe.shardtable`) named with its sha256 and required as ``shard_table``, so that loading a
pack of a million shards costs a hash and a memory map, not a million JSON objects. Version-1 manifests
still read, without per-sample checks, and say so once in the log. Anything malformed (bad JSON, wrong
types, totals that disagree with the shards, a path that leaves the dataset) raises :class:`DataError`
naming the file.

Its JSON is read field by field in :mod:`shardpipe.manifest_json`. Part of the shared core
(``shardpipe.manifest``, ``.manifest_json``, ``.shardtable``, ``.errors``, ``.formats``, ``.storage``,
``.units``), which the pack stage (``shardpipe.packing``) and the loaders (``loaders``) both stand on: it
imports neither of them, nor the sources, tools or CLI (the import-linter contracts in pyproject.toml, run
by ``make lint``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pyarrow as pa

from shardpipe.errors import DataError
from shardpipe.formats import FORMAT_INFO
from shardpipe.formats.compression import FieldCodec
from shardpipe.formats.terms import CHECKSUM_NAME, INDEX_VERSION
from shardpipe.manifest_json import (
    DIGEST_KEY,
    UnsupportedVersionError,
    check_requires,
    compression_of,
    content_digest,
    fields_of,
    format_of,
    index_layout,
    readable_version,
)
from shardpipe.shardtable import (
    TABLE_SUFFIX,
    ShardEntry,
    ShardTable,
    check_inside,
    count,
    expect,
)
from shardpipe.storage import ObjectNotFoundError, Store, open_store, redact_url, split_url
from shardpipe.storage.files import sha256_file
from shardpipe.version import __version__

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 3
PLAIN_VERSION = 2
"""The version of a manifest whose pack requires no feature: readable by every release since version 2."""
log = logging.getLogger("shardpipe")
_warned_v1: set[str] = set()


@dataclass(frozen=True, slots=True)
class Manifest:
    format: str
    fields: tuple[str, ...]
    splits: dict[str, ShardTable]
    """Each split's shards (given as any sequence of :class:`ShardEntry`, held as a :class:`ShardTable`)."""
    split_rule: dict[str, Any]
    source: dict[str, Any] = field(default_factory=dict)
    classes: tuple[str, ...] | None = None
    shard_limits: dict[str, Any] = field(default_factory=dict)
    shardpipe_version: str = __version__
    order: dict[str, Any] = field(default_factory=dict)
    """How samples are ordered within a split (method, and the seed of a hashed order)."""
    job: dict[str, Any] = field(default_factory=dict)
    """The pack job (fingerprint, output-shaping options, source) that a resume compares against."""
    skipped: dict[str, Any] = field(default_factory=dict)
    """Inputs a transform failed on and ``on_error="skip"`` left out: ``count``, and ``samples`` (the
    first ones, each ``{"key", "error"}``)."""
    manifest_version: int = field(default=MANIFEST_VERSION, compare=False)
    """The version this manifest was read as (1: no per-sample checksums); written as the lowest version
    that holds what the pack requires (:attr:`requires`)."""
    index_version: int = INDEX_VERSION
    """The index files' column layout (:mod:`shardpipe.formats.layout`)."""
    sample_checksum: str | None = CHECKSUM_NAME
    """The per-sample checksum stored in indexes and LMDB records; ``None`` when samples have none."""
    compression: dict[str, FieldCodec] = field(default_factory=dict)
    """The fields stored compressed, each with its codec, level, bound and dictionary
    (:mod:`shardpipe.formats.compression`); checksums cover the stored (compressed) bytes."""

    def __post_init__(self) -> None:
        tables = {name: ShardTable.of(s) for name, s in self.splits.items() if not isinstance(s, ShardTable)}
        object.__setattr__(self, "splits", {**self.splits, **tables})

    def split_shards(self, split: str) -> ShardTable:
        if split not in self.splits:
            raise DataError(f"split {split!r} is not in this dataset; it has {', '.join(self.splits)}")
        return self.splits[split]

    @property
    def label_fields(self) -> tuple[str, ...]:
        """Fields whose values are class indexes by the source's record (a Hugging Face ``ClassLabel``
        column), whatever their name: the loaders' ``decode="auto"`` decodes them as ``cls`` is."""
        recorded = self.source.get("class_names")
        return tuple(name for name in self.fields if isinstance(recorded, dict) and name in recorded)

    @property
    def requires(self) -> tuple[str, ...]:
        """The features a reader must know to read this pack (see the module doc)."""
        return ("compression",) * bool(self.compression) + ("shard_table",) * bool(self.table_files())

    def table_files(self) -> dict[str, ShardTable]:
        """The splits whose shard tables are files of their own (more than ``LISTED_SHARDS`` shards), by the
        file's path in the dataset."""
        return {
            check_inside(f"{name}{TABLE_SUFFIX}", f"split {name!r}"): shards
            for name, shards in self.splits.items()
            if not shards.listed
        }

    def to_json(self) -> dict[str, Any]:
        data = {
            "manifest_version": MANIFEST_VERSION if self.requires else PLAIN_VERSION,
            **({"requires": list(self.requires)} if self.requires else {}),
            "shardpipe_version": self.shardpipe_version,
            "format": self.format,
            "index_version": self.index_version,
            "sample_checksum": self.sample_checksum,
            "fields": list(self.fields),
            "classes": list(self.classes) if self.classes is not None else None,
            "source": self.source,
            "split_rule": self.split_rule,
            "shard_limits": self.shard_limits,
            **({"order": self.order} if self.order else {}),
            **({"job": self.job} if self.job else {}),
            **({"skipped": self.skipped} if self.skipped else {}),
            **(
                {"compression": {name: c.to_json() for name, c in self.compression.items()}}
                if self.compression
                else {}
            ),
            "splits": {name: _split_json(name, shards) for name, shards in self.splits.items()},
        }
        data[DIGEST_KEY] = content_digest(data)
        return data

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n"

    def fingerprint(self) -> str:
        """Short digest of the manifest's content: identifies a dataset in loader state."""
        return hashlib.sha256(self.dumps().encode()).hexdigest()[:16]

    @classmethod
    def from_json(cls, data: dict[str, Any], open_table: OpenTable | None = None) -> Manifest:
        """Parse and check a manifest's JSON; raises ``ValueError``, ``KeyError`` or ``TypeError`` saying
        what is wrong (:func:`load_manifest` turns them into a :class:`DataError` naming the file).
        ``open_table(path, sha256)`` reads a split's shard table file (:func:`read_manifest` passes one)."""
        expect(data, dict, "the manifest")
        version = readable_version(data)
        fmt = format_of(data)
        fields = fields_of(data)
        classes = data.get("classes")
        if classes is not None and not all(isinstance(c, str) for c in expect(classes, list, "classes")):
            raise ValueError("classes must be names")
        listed = expect(data["splits"], dict, "splits")
        index_version, checksum = index_layout(data) if version >= 2 else (1, None)
        compression = compression_of(data, fields)
        tables = any(isinstance(split, dict) and "table" in split for split in listed.values())
        check_requires(data, version, {"compression": bool(compression), "shard_table": tables})
        splits = {  # last: a split's table file is read only once the manifest asks for nothing unknown
            expect(name, str, "a split name"): _split(
                split, name, needs_index=FORMAT_INFO[fmt].needs_index, open_table=open_table
            )
            for name, split in listed.items()
        }
        return cls(
            format=fmt,
            fields=fields,
            compression=compression,
            splits=splits,
            split_rule=expect(data["split_rule"], dict, "split_rule"),
            source=expect(data.get("source", {}), dict, "source"),
            classes=tuple(classes) if classes is not None else None,
            shard_limits=expect(data.get("shard_limits", {}), dict, "shard_limits"),
            shardpipe_version=str(data.get("shardpipe_version", "unknown")),
            manifest_version=version,
            index_version=index_version,
            sample_checksum=checksum,
            order=expect(data.get("order", {}), dict, "order"),
            job=expect(data.get("job", {}), dict, "job"),
            skipped=expect(data.get("skipped", {}), dict, "skipped"),
        )


OpenTable = Callable[[str, str], ShardTable]
"""Reads a shard table file: ``open_table(path, sha256)``."""


def _split(split: Any, name: str, *, needs_index: bool, open_table: OpenTable | None) -> ShardTable:
    """One split's shards, listed or in a table file, checked against the split's totals."""
    expect(split, dict, f"split {name!r}")
    if "table" in split:
        table = expect(split["table"], dict, f"split {name!r}: table")
        path = check_inside(expect(table["path"], str, f"split {name!r}: table path"), f"split {name!r}")
        if open_table is None:
            raise ValueError(
                f"split {name!r} keeps its shards in {path}; read the manifest with load_manifest"
            )
        shards = open_table(path, expect(table["sha256"], str, f"split {name!r}: table sha256"))
    else:
        listed = expect(split["shards"], list, f"split {name!r}: shards")
        shards = ShardTable.of(ShardEntry.from_json(s) for s in listed)
    for what, total in (("samples", shards.num_samples.sum()), ("bytes", shards.num_bytes.sum())):
        if count(split[what], f"split {name!r}: {what}") != total:
            raise ValueError(f"split {name!r} says {split[what]} {what}, its shards add up to {total}")
    if needs_index and (missing := shards.first_without_index()) is not None:
        raise ValueError(f"shard {missing!r} has no index; this format needs one")
    return shards


def _split_json(name: str, shards: ShardTable) -> dict[str, Any]:
    totals = {"samples": int(shards.num_samples.sum()), "bytes": int(shards.num_bytes.sum())}
    if shards.listed:
        return {**totals, "shards": [s.to_json() for s in shards]}
    return {**totals, "table": {"path": f"{name}{TABLE_SUFFIX}", "sha256": shards.sha256()}}


def dataset_location(
    where: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> tuple[Store, str]:
    """The dataset root's store and the manifest's key in it, for a dataset folder or a manifest file, a
    path or a URL (a URL names the manifest when its last part ends in ``.json``)."""
    store = open_store(where, storage_options=storage_options)
    local = store.local_path()
    names_file = local.is_file() if local is not None else split_url(where)[1].split("?")[0].endswith(".json")
    if not names_file:
        return store, MANIFEST_NAME
    parent, name = split_url(where)
    return open_store(parent, storage_options=storage_options), name


def load_manifest(
    where: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> Manifest:
    """The manifest of a dataset folder or manifest file: a path, or a URL (``s3://bucket/data``,
    ``https://host/data/manifest.json``) read through the storage seam with ``storage_options``."""
    return read_manifest(*dataset_location(where, storage_options))


def read_manifest(store: Store, key: str = MANIFEST_NAME) -> Manifest:
    """The manifest at ``key`` of ``store``, checked; every problem is a :class:`DataError` naming it."""
    shown = redact_url(store.url(key))
    try:
        data = store.read(key)
    except ObjectNotFoundError as exc:
        raise DataError(
            f"no manifest at {shown}; check the location, or pack the data there with `shardpipe pack` first"
        ) from exc
    except OSError as exc:  # a folder, a device, a permission: anything but the file we need
        raise DataError(f"cannot read manifest {shown}: {exc}") from exc
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise DataError(f"cannot read manifest {shown}: {exc}") from None
    manifest = manifest_from_text(text, shown, partial(_open_table, store))
    if manifest.manifest_version < 2:
        local = store.local_path(key)
        warn_v1(shown, str(local.resolve()) if local is not None else shown, manifest.manifest_version)
    return manifest


def _open_table(store: Store, key: str, sha256: str) -> ShardTable:
    """A split's shard table file, checked against the manifest's sha256: memory-mapped where it is a
    local file (read in place, its pages shared by the node's processes), read whole where it is remote."""
    shown = redact_url(store.url(key))
    local = store.local_path(key)
    try:
        if local is not None:
            digest, data = sha256_file(local), pa.memory_map(str(local))
        else:
            content = store.read(key)
            digest, data = hashlib.sha256(content).hexdigest(), pa.py_buffer(content)
    except OSError as exc:
        raise DataError(f"cannot read the shard table {shown}: {exc}; repack the dataset") from exc
    if digest != sha256:
        raise DataError(
            f"shard table {shown}: its sha256 differs from the manifest's (damaged or replaced); repack"
        )
    try:
        return ShardTable.decode(data)
    except ValueError as exc:
        raise DataError(f"shard table {shown}: {exc}") from None


def manifest_from_text(text: str, where: str, open_table: OpenTable | None = None) -> Manifest:
    """Parse and check a manifest's text; every problem is a :class:`DataError` naming ``where``."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise DataError(f"cannot read manifest {where}: {exc}") from exc
    try:
        return Manifest.from_json(data, open_table)
    except UnsupportedVersionError as exc:
        raise DataError(f"manifest {where}: {exc}") from None
    except KeyError as exc:
        raise DataError(f"manifest {where} is malformed: missing entry {exc}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise DataError(f"manifest {where} is malformed: {exc}") from None


def warn_v1(where: str, identity: str, version: int) -> None:
    """Say once per manifest (``identity``) that a version-1 manifest is read without sample checks."""
    if identity in _warned_v1:
        return
    _warned_v1.add(identity)
    log.warning(
        "manifest %s is version %d: samples are read without per-sample checksums; repack "
        "(or rerun `shardpipe index --overwrite` on adopted shards) to add them",
        where,
        version,
    )


def write_manifest(store: Store, manifest: Manifest) -> None:
    """Put ``manifest.json`` at the store's root, whole or not at all; callers write it last, after every
    shard is in place: a dataset is complete exactly when its manifest exists."""
    for key, shards in manifest.table_files().items():
        store.put(key, shards.encode())
    store.put(MANIFEST_NAME, manifest.dumps().encode())
