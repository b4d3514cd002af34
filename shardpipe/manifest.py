"""The manifest: the only contract between the pack stage and the loaders.

``OUT/manifest.json`` records everything a loader needs to plan an epoch before reading a byte:
per-shard sample counts, sizes and checksums, and, for formats that seek by byte offset, the path of a
per-shard index (``shardpipe.formats.layout``: where each sample, key and field sits). It holds no timestamps,
so the same input and options give a byte-identical manifest.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardpipe import __version__
from shardpipe.atomic import write_bytes_atomic
from shardpipe.errors import DataError

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


@dataclass(frozen=True, slots=True)
class ShardEntry:
    path: str
    """Relative to the dataset root, with ``/`` separators."""
    num_samples: int
    num_bytes: int
    sha256: str
    index_path: str | None = None
    index_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "samples": self.num_samples,
            "bytes": self.num_bytes,
            "sha256": self.sha256,
        }
        if self.index_path is not None:
            out["index"] = {"path": self.index_path, "sha256": self.index_sha256}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardEntry:
        index = data.get("index") or {}
        return cls(
            path=data["path"],
            num_samples=int(data["samples"]),
            num_bytes=int(data["bytes"]),
            sha256=data["sha256"],
            index_path=index.get("path"),
            index_sha256=index.get("sha256"),
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

    def split_shards(self, split: str) -> tuple[ShardEntry, ...]:
        if split not in self.splits:
            raise DataError(f"split {split!r} is not in this dataset; it has {', '.join(self.splits)}")
        return self.splits[split]

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest_version": MANIFEST_VERSION,
            "shardpipe_version": self.shardpipe_version,
            "format": self.format,
            "fields": list(self.fields),
            "classes": list(self.classes) if self.classes is not None else None,
            "source": self.source,
            "split_rule": self.split_rule,
            "shard_limits": self.shard_limits,
            **({"order": self.order} if self.order else {}),
            **({"job": self.job} if self.job else {}),
            "splits": {
                name: {
                    "samples": sum(s.num_samples for s in shards),
                    "bytes": sum(s.num_bytes for s in shards),
                    "shards": [s.to_json() for s in shards],
                }
                for name, shards in self.splits.items()
            },
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n"

    def fingerprint(self) -> str:
        """Short digest of the manifest's content: identifies a dataset in loader state."""
        return hashlib.sha256(self.dumps().encode()).hexdigest()[:16]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        version = data.get("manifest_version")
        if version != MANIFEST_VERSION:
            raise DataError(
                f"manifest version {version!r} is not supported (expected {MANIFEST_VERSION}); "
                "repack with this shardpipe or upgrade it"
            )
        return cls(
            format=data["format"],
            fields=tuple(data["fields"]),
            splits={
                name: tuple(ShardEntry.from_json(s) for s in split["shards"])
                for name, split in data["splits"].items()
            },
            split_rule=data["split_rule"],
            source=data.get("source", {}),
            classes=tuple(data["classes"]) if data.get("classes") is not None else None,
            shard_limits=data.get("shard_limits", {}),
            shardpipe_version=data.get("shardpipe_version", "unknown"),
            order=data.get("order", {}),
            job=data.get("job", {}),
        )


def manifest_path(path: str | Path) -> Path:
    """Accept a dataset directory or a manifest file; return the manifest file's path."""
    path = Path(path)
    return path / MANIFEST_NAME if path.is_dir() else path


def load_manifest(path: str | Path) -> Manifest:
    file = manifest_path(path)
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError as exc:
        raise DataError(f"no manifest at {file}; pack the data with `shardpipe pack` first") from exc
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read manifest {file}: {exc}") from exc
    try:
        return Manifest.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"manifest {file} is malformed: missing or bad entry {exc}") from exc


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Write ``root/manifest.json`` atomically; callers write it last, after every shard is in place."""
    write_bytes_atomic(root / MANIFEST_NAME, manifest.dumps().encode())


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()
