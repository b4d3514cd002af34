"""Seeded, stable assignment of samples to splits, and cutting each split into shards.

A sample's split depends only on (seed, key): adding files never moves an existing sample to another
split. Shards hold samples in key order and are cut by count and/or payload bytes, so the same input and
options always give the same shards.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import re
from collections.abc import Sequence

import numpy as np

from shardpipe.errors import DataError, UsageError

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


def assign_splits(keys: Sequence[str], fractions: dict[str, float], seed: int) -> dict[str, list[int]]:
    """The rows of ``keys`` that fall in each split, ascending."""
    names = list(fractions)
    if len(names) == 1:
        return {names[0]: list(range(len(keys)))}
    bounds = list(itertools.accumulate(fractions[name] for name in names))
    bounds[-1] = 1.0  # guard against rounding leaving a sliver unassigned
    out: dict[str, list[int]] = {name: [] for name in names}
    for row, key in enumerate(keys):
        out[names[bisect.bisect_right(bounds, split_unit(key, seed))]].append(row)
    return out


def cut_shards(
    keys: Sequence[str], num_bytes: np.ndarray, *, max_samples: int | None, max_bytes: int | None
) -> list[slice]:
    """Cut samples (already in order) into runs of at most ``max_samples`` and ``max_bytes`` payload."""
    if max_bytes is not None and (too_big := np.flatnonzero(num_bytes > max_bytes)).size:
        first = int(too_big[0])
        raise DataError(
            f"sample {keys[first]!r} holds {int(num_bytes[first]):,} bytes, more than --max-bytes "
            f"{max_bytes:,}; raise --max-bytes"
        )
    return cut_runs(num_bytes, max_samples=max_samples, max_bytes=max_bytes)


def cut_runs(num_bytes: np.ndarray, *, max_samples: int | None, max_bytes: int | None) -> list[slice]:
    """Greedy runs of at most ``max_samples`` samples and ``max_bytes`` bytes; a sample larger than
    ``max_bytes`` gets a run of its own."""
    ends = np.cumsum(num_bytes)  # ends[i]: bytes of samples [0, i]
    runs, start, total = [], 0, len(num_bytes)
    while start < total:
        stop = total if max_samples is None else min(total, start + max_samples)
        if max_bytes is not None:
            before = int(ends[start - 1]) if start else 0
            fits = int(np.searchsorted(ends, before + max_bytes, side="right"))  # first run end past it
            stop = min(stop, max(fits, start + 1))
        runs.append(slice(start, stop))
        start = stop
    return runs


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
