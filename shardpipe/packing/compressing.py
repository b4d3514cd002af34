"""Compression at pack time (``--compress zstd[:LEVEL]``): which fields, their dictionaries, and what the
manifest records (:mod:`shardpipe.formats.compression` says how values are stored).

Dictionaries are trained once per pack, in the driver, before any shard is written, from a sample that
depends only on the planned data (evenly spaced samples of the scanned source, the first outputs of a
map in piece order, the first samples given to a ``DatasetWriter``), so every worker and engine compresses
with the same dictionaries and the shards stay byte-identical. They are stored before the shards, and the
manifest (written last) records their sha256.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardpipe.formats.compression import (
    FRAME_LIMIT,
    SAMPLE_BYTES,
    SAMPLE_COUNT,
    CompressSpec,
    FieldCodec,
    chosen_fields,
    dictionary_path,
)
from shardpipe.formats.compressor import FieldCompressor, train_dictionary
from shardpipe.packing.shard_writing import load_batches
from shardpipe.sources import SampleTable
from shardpipe.storage import Store


@dataclass(frozen=True, slots=True)
class Compression:
    """A pack's compression: the compressor its shard writers use and the manifest's record of it."""

    compressor: FieldCompressor
    codecs: dict[str, FieldCodec]


def plan_compression(
    spec: CompressSpec,
    fields: Sequence[str],
    given: Sequence[str] | None,
    samples: Mapping[str, Sequence[bytes]],
    max_bytes: int | None,
    out: Store,
) -> Compression | None:
    """Choose the fields, train their dictionaries on ``samples`` (field -> sampled values) and store the
    dictionaries in ``out``; None when no field is compressed."""
    names = chosen_fields(fields, given)
    if not names:
        return None
    limit = max_bytes if max_bytes is not None else FRAME_LIMIT
    dictionaries: dict[str, bytes | None] = {}
    codecs = {}
    for name in names:
        data = train_dictionary(samples.get(name, ()), spec.level)
        dictionaries[name] = data
        path = sha256 = None
        if data is not None:
            path = dictionary_path(name)
            sha256 = out.put(path, data, sha256=hashlib.sha256(data).hexdigest())
        codecs[name] = FieldCodec(spec.codec, spec.level, limit, path, sha256)
    return Compression(FieldCompressor(spec.level, dictionaries), codecs)


def sample_rows(num_bytes: np.ndarray) -> list[int]:
    """Evenly spaced rows of a table in key order: at most :data:`SAMPLE_COUNT`, about
    :data:`SAMPLE_BYTES` of payload (8 at least)."""
    total = len(num_bytes)
    if not total:
        return []
    mean = max(1, int(num_bytes.sum()) // total)
    count = min(total, SAMPLE_COUNT, max(8, SAMPLE_BYTES // mean))
    rows: list[int] = np.unique(np.linspace(0, total - 1, count).astype(np.int64)).tolist()
    return rows


def table_samples(
    table: SampleTable, where: str, source_options: Mapping[str, Any] | None
) -> dict[str, list[bytes]]:
    """Each field's values at :func:`sample_rows` of a scanned table (files read, URLs fetched)."""
    rows = sample_rows(table.num_bytes)
    found: dict[str, list[bytes]] = {name: [] for name in table.fields}
    if not rows:
        return found
    for _, names, columns in load_batches(table.take(rows), where, source_options):
        for name, column in zip(names, columns, strict=True):
            found[name] += [bytes(value) for value in column]
    return found
