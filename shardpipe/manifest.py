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
Version-1 manifests still read, without per-sample checks, and say so once in the log. Anything malformed
(bad JSON, wrong types, totals that disagree with the shards, a path that leaves the dataset) raises
:class:`DataError` naming the file.

Part of the shared core (``shardpipe.manifest``, ``.errors``, ``.formats``, ``.storage``, ``.units``),
which the pack stage (``shardpipe.packing``) and the loaders (``loaders``) both stand on: it imports neither
of them, nor the sources, tools or CLI (the import-linter contracts in pyproject.toml, run by ``make lint``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from shardpipe.errors import DataError
from shardpipe.formats import FORMAT_INFO, FORMAT_NAMES
from shardpipe.formats.compression import FieldCodec
from shardpipe.formats.terms import CHECKSUM_NAME, INDEX_VERSION, INDEX_VERSIONS
from shardpipe.storage import ObjectNotFoundError, Store, open_store, redact_url, split_url
from shardpipe.version import __version__

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
PLAIN_VERSION = 2
"""The version of a manifest whose pack requires no feature: readable by every release since version 2."""
KNOWN_FEATURES = ("compression",)
"""Features a pack may require (``requires``) that this shardpipe reads."""
DIGEST_KEY = "content_sha256"
log = logging.getLogger("shardpipe")
_warned_v1: set[str] = set()


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
        _expect(data, dict, "a shard entry")
        path = _expect(data["path"], str, "a shard path")
        where = f"shard {path!r}"
        check_inside(path, where)
        index = data.get("index")
        if index is not None:
            _expect(index, dict, f"{where}: index")
            check_inside(_expect(index["path"], str, f"{where}: index path"), f"{where}: index")
            _expect(index["sha256"], str, f"{where}: index sha256")
        return cls(
            path=path,
            num_samples=_count(data["samples"], f"{where}: samples"),
            num_bytes=_count(data["bytes"], f"{where}: bytes"),
            sha256=_expect(data["sha256"], str, f"{where}: sha256"),
            index_path=None if index is None else index["path"],
            index_sha256=None if index is None else index["sha256"],
            keys_checksum=_keys_checksum(data.get("keys_xxh3"), where),
            compressed={
                name: (_count(sizes[0], f"{where}: compressed"), _count(sizes[1], f"{where}: compressed"))
                for name, sizes in _expect(data.get("compressed", {}), dict, f"{where}: compressed").items()
            },
        )


@dataclass(frozen=True, slots=True)
class Manifest:
    format: str
    fields: tuple[str, ...]
    splits: dict[str, tuple[ShardEntry, ...]]
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

    def split_shards(self, split: str) -> tuple[ShardEntry, ...]:
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
        return ("compression",) if self.compression else ()

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
            "splits": {
                name: {
                    "samples": sum(s.num_samples for s in shards),
                    "bytes": sum(s.num_bytes for s in shards),
                    "shards": [s.to_json() for s in shards],
                }
                for name, shards in self.splits.items()
            },
        }
        data[DIGEST_KEY] = content_digest(data)
        return data

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n"

    def fingerprint(self) -> str:
        """Short digest of the manifest's content: identifies a dataset in loader state."""
        return hashlib.sha256(self.dumps().encode()).hexdigest()[:16]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        """Parse and check a manifest's JSON; raises ``ValueError``, ``KeyError`` or ``TypeError`` saying
        what is wrong (:func:`load_manifest` turns them into a :class:`DataError` naming the file)."""
        _expect(data, dict, "the manifest")
        version = data.get("manifest_version")
        if not isinstance(version, int) or isinstance(version, bool) or version not in READABLE_VERSIONS:
            raise _UnsupportedVersionError(
                f"manifest version {version!r} is not supported (this shardpipe reads "
                f"{', '.join(map(str, READABLE_VERSIONS))}); repack with this shardpipe or upgrade it"
            )
        if version >= 2 and data.get(DIGEST_KEY) != content_digest(data):
            raise ValueError(f"its {DIGEST_KEY} does not match its content (damaged or edited by hand)")
        fmt = _expect(data["format"], str, "format")
        if fmt not in FORMAT_NAMES:
            raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMAT_NAMES)}")
        fields = tuple(_expect(data["fields"], list, "fields"))
        if not all(isinstance(name, str) and name for name in fields) or len(set(fields)) != len(fields):
            raise ValueError(f"fields {list(fields)!r} must be distinct non-empty names")
        classes = data.get("classes")
        if classes is not None and not all(isinstance(c, str) for c in _expect(classes, list, "classes")):
            raise ValueError("classes must be names")
        splits = {
            _expect(name, str, "a split name"): _split(split, name, needs_index=FORMAT_INFO[fmt].needs_index)
            for name, split in _expect(data["splits"], dict, "splits").items()
        }
        index_version, checksum = 1, None
        if version >= 2:
            index_version = data["index_version"]
            if (
                not isinstance(index_version, int)
                or isinstance(index_version, bool)
                or index_version not in INDEX_VERSIONS
            ):
                readable = " or ".join(map(str, INDEX_VERSIONS))
                raise ValueError(f"index_version {index_version!r} is not {readable}")
            checksum = data["sample_checksum"]
            if checksum not in (CHECKSUM_NAME, None):
                raise ValueError(f"sample_checksum {checksum!r} is not {CHECKSUM_NAME!r}")
        compression = {
            name: FieldCodec.from_json(codec, name)
            for name, codec in _expect(data.get("compression", {}), dict, "compression").items()
        }
        if unknown := [name for name in compression if name not in fields]:
            raise ValueError(f"compression names {unknown[0]!r}, not one of the fields")
        for name, codec in compression.items():
            if codec.dictionary is not None:
                check_inside(codec.dictionary, f"the dictionary of field {name!r}")
        _check_requires(data, version, bool(compression))
        return cls(
            format=fmt,
            fields=fields,
            compression=compression,
            splits=splits,
            split_rule=_expect(data["split_rule"], dict, "split_rule"),
            source=_expect(data.get("source", {}), dict, "source"),
            classes=tuple(classes) if classes is not None else None,
            shard_limits=_expect(data.get("shard_limits", {}), dict, "shard_limits"),
            shardpipe_version=str(data.get("shardpipe_version", "unknown")),
            manifest_version=version,
            index_version=index_version,
            sample_checksum=checksum,
            order=_expect(data.get("order", {}), dict, "order"),
            job=_expect(data.get("job", {}), dict, "job"),
            skipped=_expect(data.get("skipped", {}), dict, "skipped"),
        )


class _UnsupportedVersionError(ValueError):
    """A manifest version this shardpipe cannot read: said as is, not as "malformed"."""


def _check_requires(data: dict[str, Any], version: int, compressed: bool) -> None:
    """A version-3 manifest lists what its pack requires: refuse a feature this shardpipe does not know,
    and a list that disagrees with what the manifest records (a hand edit)."""
    if version < 3:  # packs compressed before version 3 existed record compression alone
        return
    required = _expect(data.get("requires"), list, "requires")
    if unknown := [feature for feature in required if feature not in KNOWN_FEATURES]:
        raise _UnsupportedVersionError(
            f"this pack requires {', '.join(map(repr, unknown))}, which this shardpipe cannot read "
            f"(it knows {', '.join(KNOWN_FEATURES)}); upgrade shardpipe"
        )
    if ("compression" in required) != compressed:
        raise ValueError(
            f"requires {required!r} disagrees with the compression it records "
            f"({'some' if compressed else 'none'}): the manifest was edited; repack"
        )


def check_inside(path: str, what: str) -> str:
    """``path`` if it names a file inside the dataset (relative, no ``..``); raises ``ValueError``."""
    parts = PurePosixPath(path).parts
    if not parts or path.startswith("/") or ".." in parts or "\\" in path or "\x00" in path:
        raise ValueError(f"{what}: the path {path!r:.80} must be relative inside the dataset")
    return path


def content_digest(data: dict[str, Any]) -> str:
    """sha256 of a manifest's JSON content without its own digest, independent of key order and spacing."""
    content = {key: value for key, value in data.items() if key != DIGEST_KEY}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _expect(value: Any, kind: type, what: str) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"{what} is {type(value).__name__} {value!r:.60}, expected {kind.__name__}")
    return value


def _keys_checksum(value: Any, where: str) -> str | None:
    if value is not None and not (isinstance(value, str) and re.fullmatch("[0-9a-f]{16}", value)):
        raise ValueError(f"{where}: keys_xxh3 is {value!r:.60}, expected 16 hex digits")
    return value


def _count(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} is {value!r:.60}, expected a count >= 0")
    return value


def _split(split: Any, name: str, *, needs_index: bool) -> tuple[ShardEntry, ...]:
    """One split's shards, checked against the split's totals."""
    _expect(split, dict, f"split {name!r}")
    shards = tuple(ShardEntry.from_json(s) for s in _expect(split["shards"], list, f"split {name!r}: shards"))
    for what, key, total in (
        ("samples", "samples", sum(s.num_samples for s in shards)),
        ("bytes", "bytes", sum(s.num_bytes for s in shards)),
    ):
        if _count(split[key], f"split {name!r}: {what}") != total:
            raise ValueError(f"split {name!r} says {split[key]} {what}, its shards add up to {total}")
    if needs_index and (missing := [s.path for s in shards if s.index_path is None]):
        raise ValueError(f"shard {missing[0]!r} has no index; this format needs one")
    return shards


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
    manifest = manifest_from_text(text, shown)
    if manifest.manifest_version < 2:
        local = store.local_path(key)
        warn_v1(shown, str(local.resolve()) if local is not None else shown, manifest.manifest_version)
    return manifest


def manifest_from_text(text: str, where: str) -> Manifest:
    """Parse and check a manifest's text; every problem is a :class:`DataError` naming ``where``."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise DataError(f"cannot read manifest {where}: {exc}") from exc
    try:
        return Manifest.from_json(data)
    except _UnsupportedVersionError as exc:
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
    store.put(MANIFEST_NAME, manifest.dumps().encode())
