"""Seeded, stable assignment of samples to splits, and cutting each split into shards.

A sample's split depends only on (seed, key): adding files never moves an existing sample to another
split. Shards hold samples in key order and are cut by count and/or payload bytes, so the same input and
options always give the same shards.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from shardpipe.errors import DataError, UsageError
from shardpipe.sources import SampleSource

SPLIT_METHOD = "blake2b-64(f'{seed}:{key}') / 2**64 against cumulative fractions, in the order given"
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def parse_split(spec: str | None) -> dict[str, float]:
    """``"train=0.9,val=0.1"`` -> ``{"train": 0.9, "val": 0.1}``; ``None`` -> ``{"train": 1.0}``."""
    if spec is None:
        return {"train": 1.0}
    fractions: dict[str, float] = {}
    for part in spec.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or not _NAME.match(name):
            raise UsageError(f"--split {spec!r}: expected NAME=FRACTION pairs like train=0.9,val=0.1")
        if name in fractions:
            raise UsageError(f"--split {spec!r}: split {name!r} is named twice")
        try:
            fraction = float(value)
        except ValueError:
            raise UsageError(f"--split {spec!r}: {value!r} is not a number") from None
        if not 0 < fraction <= 1:
            raise UsageError(f"--split {spec!r}: fraction {fraction} of {name!r} must be in (0, 1]")
        fractions[name] = fraction
    if abs(sum(fractions.values()) - 1) > 1e-6:
        raise UsageError(f"--split {spec!r}: fractions sum to {sum(fractions.values()):g}, not 1")
    return fractions


def split_unit(key: str, seed: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, key)."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def assign_splits(
    samples: Sequence[SampleSource], fractions: dict[str, float], seed: int
) -> dict[str, list[SampleSource]]:
    names = list(fractions)
    bounds = []
    total = 0.0
    for name in names:
        total += fractions[name]
        bounds.append(total)
    bounds[-1] = 1.0  # guard against rounding leaving a sliver unassigned
    out: dict[str, list[SampleSource]] = {name: [] for name in names}
    for sample in samples:
        if len(names) == 1:
            out[names[0]].append(sample)
            continue
        unit = split_unit(sample.key, seed)
        out[names[next(i for i, bound in enumerate(bounds) if unit < bound)]].append(sample)
    return out


def cut_shards(
    samples: Sequence[SampleSource], *, max_samples: int | None, max_bytes: int | None
) -> list[list[SampleSource]]:
    """Cut samples (already in order) into shards of at most ``max_samples`` and ``max_bytes`` payload."""
    shards: list[list[SampleSource]] = []
    current: list[SampleSource] = []
    current_bytes = 0
    for sample in samples:
        if max_bytes is not None and sample.num_bytes > max_bytes:
            raise DataError(
                f"sample {sample.key!r} holds {sample.num_bytes:,} bytes, more than --max-bytes "
                f"{max_bytes:,}; raise --max-bytes"
            )
        full = (max_samples is not None and len(current) >= max_samples) or (
            max_bytes is not None and current_bytes + sample.num_bytes > max_bytes
        )
        if current and full:
            shards.append(current)
            current, current_bytes = [], 0
        current.append(sample)
        current_bytes += sample.num_bytes
    if current:
        shards.append(current)
    return shards


_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
}


def parse_size(text: str) -> int:
    """``"256MB"`` -> 256_000_000; ``"64KiB"`` -> 65_536; plain integers are bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise UsageError(f"size {text!r} is not understood; write e.g. 256MB, 64KiB or 1000000")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise UsageError(f"size {text!r} must be positive")
    return size
