"""A manifest's JSON read field by field (:meth:`shardpipe.manifest.Manifest.from_json` calls these in
turn): each raises ``ValueError`` saying what is wrong, and :class:`UnsupportedVersionError` for what this
shardpipe cannot read at all, a version or a required feature."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from shardpipe.formats import FORMAT_NAMES
from shardpipe.formats.compression import FieldCodec
from shardpipe.formats.terms import CHECKSUM_NAME, INDEX_VERSIONS
from shardpipe.shardtable import check_inside, expect

READABLE_VERSIONS = (1, 2, 3)
KNOWN_FEATURES = ("compression", "shard_table")
"""Features a pack may require (``requires``) that this shardpipe reads."""
DIGEST_KEY = "content_sha256"


class UnsupportedVersionError(ValueError):
    """A manifest version this shardpipe cannot read: said as is, not as "malformed"."""


def check_requires(data: dict[str, Any], version: int, recorded: dict[str, bool]) -> None:
    """A version-3 manifest lists what its pack requires: refuse a feature this shardpipe does not know,
    and a list that disagrees with what the manifest records (a hand edit)."""
    if version < 3:  # packs compressed before version 3 existed record compression alone
        if recorded["shard_table"]:
            raise ValueError("a shard table file needs manifest version 3, which lists it in requires")
        return
    required = expect(data.get("requires"), list, "requires")
    if unknown := [feature for feature in required if feature not in KNOWN_FEATURES]:
        raise UnsupportedVersionError(
            f"this pack requires {', '.join(map(repr, unknown))}, which this shardpipe cannot read "
            f"(it knows {', '.join(KNOWN_FEATURES)}); upgrade shardpipe"
        )
    for feature, present in recorded.items():
        if (feature in required) != present:
            raise ValueError(
                f"requires {required!r} disagrees with the {feature} it records "
                f"({'some' if present else 'none'}): the manifest was edited; repack"
            )


def readable_version(data: dict[str, Any]) -> int:
    """The manifest's version, one this shardpipe reads, its digest checked from version 2 on (damage to
    the manifest itself is an error, not silently different data)."""
    version = data.get("manifest_version")
    if not isinstance(version, int) or isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise UnsupportedVersionError(
            f"manifest version {version!r} is not supported (this shardpipe reads "
            f"{', '.join(map(str, READABLE_VERSIONS))}); repack with this shardpipe or upgrade it"
        )
    if version >= 2 and data.get(DIGEST_KEY) != content_digest(data):
        raise ValueError(f"its {DIGEST_KEY} does not match its content (damaged or edited by hand)")
    return version


def format_of(data: dict[str, Any]) -> str:
    """The shards' format, one this shardpipe knows."""
    fmt: str = expect(data["format"], str, "format")
    if fmt not in FORMAT_NAMES:
        raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMAT_NAMES)}")
    return fmt


def fields_of(data: dict[str, Any]) -> tuple[str, ...]:
    """The samples' fields: distinct non-empty names."""
    fields = tuple(expect(data["fields"], list, "fields"))
    if not all(isinstance(name, str) and name for name in fields) or len(set(fields)) != len(fields):
        raise ValueError(f"fields {list(fields)!r} must be distinct non-empty names")
    return fields


def index_layout(data: dict[str, Any]) -> tuple[int, str | None]:
    """A version-2 or later manifest's ``index_version`` and ``sample_checksum``, each one this
    shardpipe reads."""
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
    return index_version, checksum


def compression_of(data: dict[str, Any], fields: tuple[str, ...]) -> dict[str, FieldCodec]:
    """The codecs of the fields stored compressed: each names one of ``fields``, its dictionary (if any)
    a path inside the dataset."""
    compression = {
        name: FieldCodec.from_json(codec, name)
        for name, codec in expect(data.get("compression", {}), dict, "compression").items()
    }
    if unknown := [name for name in compression if name not in fields]:
        raise ValueError(f"compression names {unknown[0]!r}, not one of the fields")
    for name, codec in compression.items():
        if codec.dictionary is not None:
            check_inside(codec.dictionary, f"the dictionary of field {name!r}")
    return compression


def content_digest(data: dict[str, Any]) -> str:
    """sha256 of a manifest's JSON content without its own digest, independent of key order and spacing."""
    content = {key: value for key, value in data.items() if key != DIGEST_KEY}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
