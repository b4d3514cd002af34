"""The scanned samples as a table, the form every later stage (split, plan, write) works on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    origins: np.ndarray | None = None
    """``(num_samples, 2)`` int64: each sample's file (in :attr:`origin_files`) and row, for a source whose
    samples are rows of files (a Parquet dataset), so that a message names them; None otherwise."""
    origin_files: tuple[str, ...] = ()

    def origin(self, row: int) -> str | None:
        """``"data/train-00000-of-00001.parquet row 8"``: where sample ``row`` came from, if known."""
        if self.origins is None:
            return None
        number, file_row = self.origins[row].tolist()
        return f"{self.origin_files[number]} row {file_row + 1}"

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def num_bytes(self) -> np.ndarray:
        """Each sample's payload bytes."""
        return np.asarray(self.sizes.sum(axis=1))

    def take(self, rows: slice | list[int]) -> SampleTable:
        """The samples at ``rows`` (a slice, or a list of indices in the order wanted), as a table."""
        if isinstance(rows, slice):
            keys, columns = self.keys[rows], [column[rows] for column in self.columns]
        else:
            keys, columns = (
                [self.keys[i] for i in rows],
                [[column[i] for i in rows] for column in self.columns],
            )
        return SampleTable(
            keys=keys,
            fields=self.fields,
            columns=columns,
            sizes=self.sizes[rows],
            origins=None if self.origins is None else self.origins[rows],
            origin_files=self.origin_files,
        )


@dataclass(frozen=True, slots=True)
class Scan:
    table: SampleTable
    classes: tuple[str, ...] | None
    num_skipped_incomplete: int
    num_ignored_files: int
    kind: str = "tree"
    """``tree``, ``list`` or ``parquet``, as the manifest records the source."""
    splits: tuple[str, ...] = ()
    """The source's own splits (a Parquet dataset's, from its files' names), in order; empty for a
    source without them."""
    row_splits: tuple[str, ...] | None = None
    """Each row's split among :attr:`splits`, aligned with :attr:`table`; None without them."""
    details: dict[str, Any] = field(default_factory=dict)
    """What the manifest's ``source`` records about the source beyond its kind and path."""
