"""The words every format module shares: the shapes samples travel in, and the versions shards record.

A leaf: it imports nothing of shardpipe, so the interface (:mod:`.base`), the index (:mod:`.layout`), the
columns (:mod:`.bytecolumn`) and the manifest all stand on it and the imports among them point one way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Fields = dict[str, bytes]
"""A sample's named fields: field name (the file extension, e.g. ``jpg``) -> raw bytes."""

Column = Sequence[bytes | memoryview]
"""One field's values for a batch of samples; a writer must not keep a ``memoryview`` past the call."""

ColumnsOut = tuple[list[str], dict[str, Any]]
"""Samples as columns: their keys, and for each field name its values in the same order as one
:mod:`~shardpipe.formats.bytecolumn` column (``None`` where a sample lacks the field)."""

Span = tuple[int, int]
"""A ``[start, stop)`` byte span in a shard file."""

INDEX_VERSION = 2
"""The index column layout written now (see :mod:`.layout`); the manifest records it."""
INDEX_VERSIONS = (1, 2)
"""The index column layouts this shardpipe reads."""

CHECKSUM_NAME = "xxh3_64"
"""The per-sample checksum, as the manifest names it (docs/design.md, "Formats and the index", says why)."""
