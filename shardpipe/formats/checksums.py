"""The per-sample checksum (xxh3_64 of a sample's bytes, ``CHECKSUM_NAME`` in the index) and the one check
of samples against theirs.

Every read checks through :func:`first_mismatch` and names the sample it returns (a run, a joined window,
LMDB records, a record decoded on its own) but two, for speed (docs/design.md, "Reading"): the landing
kernel hashes each large sample in the loop that copies it, while its bytes are in the CPU cache, and a
random get checks its one sample inline. A leaf: it imports nothing of the formats.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import xxhash

checksum = xxhash.xxh3_64_intdigest
"""The per-sample checksum of a span's bytes."""


def first_mismatch(
    views: memoryview | Sequence[memoryview],
    begins: Sequence[int],
    ends: Sequence[int],
    expected: np.ndarray | Sequence[int],
) -> int | None:
    """The position of the first sample whose bytes ``[begins[i], ends[i])`` differ from its checksum
    ``expected[i]``; ``None`` when every one agrees. ``views`` is one view that holds them all, or one view
    per sample."""
    if len(begins) == 1:  # one record decoded on its own: no arrays
        view = views if isinstance(views, memoryview) else views[0]
        return None if checksum(view[begins[0] : ends[0]]) == expected[0] else 0
    sources = itertools.repeat(views) if isinstance(views, memoryview) else views
    spans = zip(sources, begins, ends, strict=False)  # one view for all is endless
    sums = np.fromiter((checksum(view[a:b]) for view, a, b in spans), np.uint64, len(begins))
    bad = np.flatnonzero(sums != np.asarray(expected, np.uint64))
    return int(bad[0]) if len(bad) else None
