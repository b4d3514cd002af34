"""Finding a sample of a split by its key: a table of key hashes, built once, searched in O(log n).

Keys live in the shards, not in their indexes, so the table is built by reading each sample's key once
(the key's own bytes where the index has their span, else the samples). It holds 16 bytes per sample (a
64-bit hash and a position), not the keys: a hit is confirmed by reading the sample it points to, so a
hash collision costs one more read, never a wrong answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import xxhash


def key_hash(key: str) -> int:
    return xxhash.xxh3_64_intdigest(key.encode())


@dataclass(frozen=True, slots=True)
class KeyTable:
    """Every sample's key hash, sorted, with the sample's position in the split."""

    hashes: np.ndarray  # uint64, sorted
    positions: np.ndarray  # int64, positions[i] is the sample whose key hashes to hashes[i]

    @classmethod
    def build(cls, keys: Iterable[str]) -> KeyTable:
        """The table of ``keys``, the split's keys in position order."""
        hashes = np.fromiter((key_hash(key) for key in keys), dtype=np.uint64)
        order = np.argsort(hashes, kind="stable")
        return cls(hashes[order], order.astype(np.int64))

    def candidates(self, key: str) -> Sequence[int]:
        """Positions whose key hashes as ``key`` does (usually one; none when the key is absent)."""
        h = np.uint64(key_hash(key))
        first = int(np.searchsorted(self.hashes, h, side="left"))
        last = int(np.searchsorted(self.hashes, h, side="right"))
        found: list[int] = self.positions[first:last].tolist()
        return found
