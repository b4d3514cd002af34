"""A pack job's options: which of them shape the output (and so the job's identity), and their checks.

``workers``, ``resume`` and ``overwrite`` change how a job runs, never what it writes; every other option
is in :data:`JOB_OPTIONS`, recorded in the manifest and compared by a resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardpipe.errors import UsageError
from shardpipe.formats import format_info
from shardpipe.packing.split import SPLIT_METHOD

ORDERS = ("hashed", "sorted")
ORDER_HASH = "blake2b-64(f'{seed}:{key}', person=b'shardpipe-order') ascending, ties by key"
ORDER_PERSON = b"shardpipe-order"  # the hash domain: the split hashes the same text without it
JOB_OPTIONS = (
    "format", "split", "seed", "order", "max_samples", "max_bytes", "labels", "literal_fields",
    "skip_incomplete",
)  # fmt: skip
"""The :class:`PackOptions` fields that shape the output; the others say how to run the job."""


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
    split: dict[str, float] = field(default_factory=lambda: {"train": 1.0})
    seed: int = 0
    order: str = "hashed"
    max_samples: int | None = None
    max_bytes: int | None = 256_000_000
    workers: int = 1
    labels: str | None = None
    literal_fields: tuple[str, ...] = ()
    skip_incomplete: bool = False
    resume: bool = False
    overwrite: bool = False

    def __post_init__(self) -> None:
        format_info(self.format)
        if self.order not in ORDERS:
            raise UsageError(f"order {self.order!r} is not one of {', '.join(ORDERS)}")
        if self.workers < 1:
            raise UsageError(f"workers must be at least 1, got {self.workers}")
        if self.max_samples is not None and self.max_samples < 1:
            raise UsageError(f"max_samples must be at least 1, got {self.max_samples}")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise UsageError(f"max_bytes must be at least 1, got {self.max_bytes}")
        if self.resume and self.overwrite:
            raise ConflictingOptionsError.of("resume", "overwrite")

    def job_options(self) -> dict[str, Any]:
        """The options that shape the output, JSON-safe: what the manifest records and a resume compares."""
        found = {name: getattr(self, name) for name in JOB_OPTIONS}
        found["literal_fields"] = list(self.literal_fields)
        return found

    def split_rule(self) -> dict[str, Any]:
        """How samples are assigned to splits, as the manifest records it."""
        return {"method": SPLIT_METHOD, "seed": self.seed, "fractions": self.split}

    def shard_limits(self) -> dict[str, Any]:
        return {"max_samples": self.max_samples, "max_bytes": self.max_bytes}

    def order_rule(self) -> dict[str, Any]:
        """How samples are ordered within a split, as the manifest records it."""
        if self.order == "sorted":
            return {"method": "sorted", "rule": "key order (code point order of the key)"}
        return {"method": "hashed", "rule": ORDER_HASH, "seed": self.seed}
