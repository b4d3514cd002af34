"""The per-sample checksum (xxh3_64 of a sample's bytes, ``CHECKSUM_NAME`` in the index) and the one check
of samples against theirs.

Every read checks here: many samples at once through :func:`first_mismatch` (a run, a joined window,
LMDB's records), one through :func:`agrees` (a random get, a record decoded on its own, and each large
sample the landing kernel checks in the loop that copies it, while its bytes are in the CPU cache). The
caller names the sample. A leaf: it imports nothing of the formats.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import xxhash

checksum = xxhash.xxh3_64_intdigest
"""The per-sample checksum of a span's bytes."""


def agrees(span: memoryview, expected: int) -> bool:
    """Whether one sample's bytes agree with its checksum."""
    return checksum(span) == expected


def first_mismatch(
    views: memoryview | Sequence[memoryview],
    begins: Sequence[int],
    ends: Sequence[int],
    expected: np.ndarray | Sequence[int],
) -> int | None:
    """The position of the first sample whose bytes ``[begins[i], ends[i])`` differ from its checksum
    ``expected[i]``; ``None`` when every one agrees. ``views`` is one view that holds them all, or one view
    per sample."""
    sources = itertools.repeat(views) if isinstance(views, memoryview) else views
    spans = zip(sources, begins, ends, strict=False)  # one view for all is endless
    sums = np.fromiter((checksum(view[a:b]) for view, a, b in spans), np.uint64, len(begins))
    bad = np.flatnonzero(sums != np.asarray(expected, np.uint64))
    return int(bad[0]) if len(bad) else None
