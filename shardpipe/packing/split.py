"""Which split a sample belongs to: a function of (seed, key) alone, so adding files never moves an
existing sample to another split."""

from __future__ import annotations

import bisect
import hashlib
import itertools
import re
from collections.abc import Sequence

from shardpipe.errors import UsageError

SPLIT_METHOD = "blake2b-64(f'{seed}:{key}') / 2**64 against cumulative fractions, in the order given"
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def check_split_name(name: str) -> str:
    """A split's name: a folder name of letters, digits, ``_`` and ``-``."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise UsageError(f"split name {name!r} must be letters, digits, '_' or '-' (it names a folder)")
    return name


def parse_split(spec: str | None) -> dict[str, float]:
    """``"train=0.9,val=0.1"`` -> ``{"train": 0.9, "val": 0.1}``; ``None`` -> ``{"train": 1.0}``."""
    if spec is None:
        return {"train": 1.0}
    fractions: dict[str, float] = {}
    for part in spec.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or not _NAME.match(name):
            raise UsageError(f"split {spec!r}: expected NAME=FRACTION pairs like train=0.9,val=0.1")
        if name in fractions:
            raise UsageError(f"split {spec!r}: split {name!r} is named twice")
        try:
            fraction = float(value)
        except ValueError:
            raise UsageError(f"split {spec!r}: {value!r} is not a number") from None
        if not 0 < fraction <= 1:
            raise UsageError(f"split {spec!r}: fraction {fraction} of {name!r} must be in (0, 1]")
        fractions[name] = fraction
    if abs(sum(fractions.values()) - 1) > 1e-6:
        raise UsageError(f"split {spec!r}: fractions sum to {sum(fractions.values()):g}, not 1")
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
