"""The scanned samples as a table, the form every later stage (split, plan, write) works on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Grouped = dict[str, dict[str, tuple[str | bytes, int]]]
"""field -> key -> (file path or literal bytes, size), as a source is read: field-major, because a
dataset has a few fields and many keys (no dict per sample)."""


@dataclass(frozen=True, slots=True)
class SampleTable:
    """Samples as columns, one row per sample (in key order as scanned; the plan may reorder them).

    Columns rather than one object per sample, because the pack stage splits, cuts, hashes and sends the
    samples to worker processes: a list of strings pickles in one C loop, a list of objects does not.
    """

    keys: list[str]
    fields: tuple[str, ...]
    """Field names, sorted."""
    columns: list[list[str | bytes]]
    """``columns[j][i]``: field ``fields[j]`` of sample ``i``, a file path (``str``) or literal bytes."""
    sizes: np.ndarray
    """``(num_samples, num_fields)`` int64: the bytes of each field, as scanned."""

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def num_bytes(self) -> np.ndarray:
        """Each sample's payload bytes."""
        return np.asarray(self.sizes.sum(axis=1))

    def take(self, rows: slice | list[int]) -> SampleTable:
        """The samples at ``rows`` (a slice, or a list of indices in the order wanted), as a table."""
        if isinstance(rows, slice):
            return SampleTable(
                self.keys[rows], self.fields, [c[rows] for c in self.columns], self.sizes[rows]
            )
        columns = [[column[i] for i in rows] for column in self.columns]
        return SampleTable([self.keys[i] for i in rows], self.fields, columns, self.sizes[rows])


@dataclass(frozen=True, slots=True)
class Scan:
    table: SampleTable
    classes: tuple[str, ...] | None
    num_skipped_incomplete: int
    num_ignored_files: int
    kind: str = "tree"
    """``tree`` or ``list``, as the manifest records the source."""
