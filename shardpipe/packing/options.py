"""A pack job's options: which of them shape the output (and so the job's identity), and their checks.

``workers``, ``resume`` and ``overwrite`` change how a job runs, never what it writes; every other option
is in :data:`JOB_OPTIONS`, recorded in the manifest and compared by a resume.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shardpipe.errors import UsageError
from shardpipe.formats import format_info
from shardpipe.formats.compression import CompressSpec, parse_compress
from shardpipe.packing.images import DEFAULT_QUALITY, ImagePreparation
from shardpipe.packing.samples import Sample
from shardpipe.packing.split import SPLIT_METHOD
from shardpipe.packing.transform import OnError, Transform, map_identity, resolve

ORDERS = ("hashed", "sorted")
ORDER_HASH = "blake2b-64(f'{seed}:{key}', person=b'shardpipe-order') ascending, ties by key"
ORDER_PERSON = b"shardpipe-order"  # the hash domain: the split hashes the same text without it
SOURCE_SPLITS = (
    "the source's own: each Parquet file's split from its name or folder (shardpipe.sources.parquet_layout)"
)
JOB_OPTIONS = (
    "format",
    "split",
    "seed",
    "order",
    "max_samples",
    "max_bytes",
    "labels",
    "literal_fields",
    "skip_incomplete",
)
"""The :class:`PackOptions` fields that shape the output of every job; a job that transforms its samples
also records the transform (:meth:`PackOptions.job_options`). The others say how to run the job."""
TRANSFORM_OPTIONS = ("map", "map_version", "on_error", "image_max_side", "image_quality")
"""The fields that shape the output when a job maps or prepares its samples, recorded only then (so the
job of a pack without them is identified as it was before they existed)."""


class ConflictingOptionsError(UsageError):
    """Two options were both given that exclude each other; ``names`` are the options."""

    def __init__(self, message: str, *, names: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.names = names

    @classmethod
    def of(cls, *names: str) -> ConflictingOptionsError:
        return cls(f"{' and '.join(names)} contradict each other; choose one", names=names)


@dataclass(frozen=True, slots=True)
class PackOptions:
    """A pack job. ``workers``, ``resume`` and ``overwrite`` change how it runs, never its output."""

    format: str
    split: dict[str, float] | None = None
    """Fractions of a seeded split by key hash, e.g. ``{"train": 0.9, "val": 0.1}``. None: the source's
    own splits where it has them (a Parquet dataset's, from its files' names), else one split ``train``."""
    seed: int = 0
    order: str = "hashed"
    max_samples: int | None = None
    max_bytes: int | None = 256_000_000
    workers: int | None = None
    """Processes that scan, map and write; ``None``: the CPUs this process may use. The output is the
    same for any count."""
    labels: str | None = None
    literal_fields: tuple[str, ...] = ()
    skip_incomplete: bool = False
    resume: bool = False
    overwrite: bool = False
    map: Callable[[Sample], Any] | str | None = None
    """A function applied to every sample (:mod:`shardpipe.packing.mapping`): a callable, or
    ``"package.module:function"``."""
    map_version: str | None = None
    """A version the user declares for the map, recorded with it (a resume compares it)."""
    on_error: OnError = "raise"
    """A sample the map or the image preparation fails on: ``raise`` stops the pack naming it, ``skip``
    leaves it out, counted and named in the manifest."""
    image_max_side: int | None = None
    """Shrink image fields so their longest side is at most this (:mod:`shardpipe.packing.images`)."""
    image_quality: int | None = None
    """The JPEG / WebP quality of shrunk images (default 90)."""
    key_column: str | None = None
    """A Parquet dataset's column that holds the keys (default: each row's position in its split)."""
    field_map: dict[str, str] = field(default_factory=dict)
    """A Parquet dataset's column -> field name (``{"label": "cls", "image": "jpg"}``); an empty name
    leaves the column out. Unnamed columns keep their own names (:mod:`shardpipe.sources.parquet_table`)."""
    compress: str | None = None
    """``"zstd"`` or ``"zstd:LEVEL"``: fields stored compressed per sample
    (:mod:`shardpipe.formats.compression`); None stores them as they came."""
    compress_fields: tuple[str, ...] = ()
    """The fields to compress (default: those whose kind is not compressed already, e.g. not ``jpg``)."""
    source_splits: tuple[str, ...] = ()
    """Set by the pack, not by users: the source's own splits, kept because ``split`` is None."""

    def __post_init__(self) -> None:
        format_info(self.format)
        if self.key_column is not None and not self.key_column:
            raise UsageError("key_column must name a column, got ''")
        for column, name in self.field_map.items():
            if not isinstance(column, str) or not column or not isinstance(name, str):
                raise UsageError(f"field_map maps column names to field names, got {column!r}: {name!r}")
        if self.order not in ORDERS:
            raise UsageError(f"order {self.order!r} is not one of {', '.join(ORDERS)}")
        if self.workers is not None and self.workers < 1:
            raise UsageError(f"workers must be at least 1, got {self.workers}")
        if self.max_samples is not None and self.max_samples < 1:
            raise UsageError(f"max_samples must be at least 1, got {self.max_samples}")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise UsageError(f"max_bytes must be at least 1, got {self.max_bytes}")
        if self.resume and self.overwrite:
            raise ConflictingOptionsError.of("resume", "overwrite")
        if self.on_error not in ("raise", "skip"):
            raise UsageError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.image_quality is not None and self.image_max_side is None:
            raise UsageError("image_quality applies to the images image_max_side shrinks: give it too")
        parse_compress(self.compress)
        if self.compress_fields and self.compress_spec is None:
            raise UsageError("compress_fields names the fields to compress: give compress too")
        self.transform()  # checks the map's spec and the image settings now, not in a worker

    @property
    def num_workers(self) -> int:
        return self.workers if self.workers is not None else usable_cpus()

    @property
    def compress_spec(self) -> CompressSpec | None:
        return parse_compress(self.compress)

    def transform(self) -> Transform | None:
        """What runs on every sample, or None when the pack copies samples as they are."""
        images = None
        if self.image_max_side is not None:
            images = ImagePreparation(self.image_max_side, self.image_quality or DEFAULT_QUALITY)
        if self.map is None and images is None:
            return None
        if self.map is not None:
            resolve(self.map)
        return Transform(self.map, images)

    @property
    def split_fractions(self) -> dict[str, float]:
        """The fractions of the split by key hash (one split ``train`` when none were given)."""
        return self.split if self.split is not None else {"train": 1.0}

    @property
    def split_names(self) -> tuple[str, ...]:
        """The splits of the output, in manifest order."""
        return self.source_splits or tuple(self.split_fractions)

    def job_options(self) -> dict[str, Any]:
        """The options that shape the output, JSON-safe: what the manifest records and a resume compares.

        Those describing a Parquet dataset are recorded only when given, so a job without them is
        identified as it was before they existed."""
        found = {name: getattr(self, name) for name in JOB_OPTIONS}
        found["split"] = "source" if self.source_splits else self.split_fractions
        found["literal_fields"] = list(self.literal_fields)
        if self.key_column is not None:
            found["key_column"] = self.key_column
        if self.field_map:
            found["field_map"] = dict(self.field_map)
        if (spec := self.compress_spec) is not None:  # recorded only when given, as the Parquet options
            found["compress"] = spec.to_json()
            found["compress_fields"] = list(self.compress_fields)
        transform = self.transform()
        if transform is not None:
            found["map"] = None if self.map is None else map_identity(self.map, self.map_version)
            found["image"] = None if transform.images is None else transform.images.identity()
            found["on_error"] = self.on_error
        return found

    def split_rule(self) -> dict[str, Any]:
        """How samples are assigned to splits, as the manifest records it."""
        if self.source_splits:
            return {"method": SOURCE_SPLITS, "splits": list(self.source_splits)}
        return {"method": SPLIT_METHOD, "seed": self.seed, "fractions": self.split_fractions}

    def shard_limits(self) -> dict[str, Any]:
        return {"max_samples": self.max_samples, "max_bytes": self.max_bytes}

    def order_rule(self) -> dict[str, Any]:
        """How samples are ordered within a split, as the manifest records it."""
        if self.order == "sorted":
            return {"method": "sorted", "rule": "key order (code point order of the key)"}
        return {"method": "hashed", "rule": ORDER_HASH, "seed": self.seed}


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1
