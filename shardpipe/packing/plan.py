"""The pack plan: which sample goes to which shard, in which order, and the job's fingerprint.

The plan is made once, before any shard is written, and depends only on the scanned samples and the
options that shape the output (:data:`JOB_OPTIONS`): the same input gives the same plan on any machine,
whoever runs it, so every shard's bytes are fixed before its writer starts. Invariants:

* Split: a sample's split depends only on (seed, key) (``shardpipe.packing.split``), or is the source's
  own (a Parquet dataset's files' splits), kept as they are.
* Order: within a split, ``sorted`` keeps key order; ``hashed`` orders by a seeded hash of the key, in a
  hash domain distinct from the split's, so adding files never reorders existing samples relative to
  each other, and a tree laid out by class still gives shards that mix classes.
* Cuts: shards are cut greedily by count and/or payload bytes, in plan order.
* Fingerprint: a digest of the job options and every shard's planned contents (keys, paths or values,
  sizes); a resume never mixes two jobs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardpipe.errors import DataError
from shardpipe.packing.options import ORDER_PERSON, PackOptions
from shardpipe.packing.split import assign_splits
from shardpipe.sources import SampleTable


@dataclass(frozen=True, slots=True)
class ShardJob:
    """One shard to write: everything its writer needs, picklable, independent of who runs it."""

    split: str
    relpath: str
    samples: SampleTable


class SampleTooLargeError(DataError):
    """A single sample holds more payload than a shard may: no cut can place it."""

    def __init__(self, message: str, *, key: str = "", num_bytes: int = 0, max_bytes: int = 0) -> None:
        super().__init__(message)
        self.key, self.num_bytes, self.max_bytes = key, num_bytes, max_bytes

    @classmethod
    def of(cls, key: str, num_bytes: int, max_bytes: int) -> SampleTooLargeError:
        message = (
            f"sample {key!r} holds {num_bytes:,} bytes, more than the shard limit max_bytes={max_bytes:,}"
        )
        return cls(message, key=key, num_bytes=num_bytes, max_bytes=max_bytes)


def split_samples(
    table: SampleTable, options: PackOptions, row_splits: Sequence[str] | None = None
) -> dict[str, SampleTable]:
    """Each split's samples in plan order. ``table`` is in key order, as a scan returns it; ``row_splits``
    (aligned with it) are the source's own splits, kept when ``options.source_splits`` names them."""
    order = hashed_order(table.keys, options.seed) if options.order == "hashed" else None
    if order is not None:
        table = table.take(order)
    by_split: dict[str, list[int]]
    if len(options.source_splits) == 1:
        by_split = {options.source_splits[0]: list(range(len(table)))}
    elif options.source_splits:
        if row_splits is None:
            raise ValueError("options.source_splits needs each row's split")  # a caller's mistake
        names = row_splits if order is None else [row_splits[i] for i in order]
        by_split = {name: [] for name in options.source_splits}
        for row, name in enumerate(names):
            by_split[name].append(row)
    else:
        by_split = assign_splits(table.keys, options.split_fractions, options.seed)
    return {name: table if len(rows) == len(table) else table.take(rows) for name, rows in by_split.items()}


def plan_jobs(
    table: SampleTable, suffix: str, options: PackOptions, row_splits: Sequence[str] | None = None
) -> list[ShardJob]:
    """Every shard of every split, in manifest order (``row_splits``: see :func:`split_samples`)."""
    jobs = []
    for name, samples in split_samples(table, options, row_splits).items():
        runs = cut_shards(
            samples.keys, samples.num_bytes, max_samples=options.max_samples, max_bytes=options.max_bytes
        )
        jobs += [
            ShardJob(name, f"{name}/shard-{i:06d}{suffix}", samples.take(run)) for i, run in enumerate(runs)
        ]
    return jobs


def hashed_order(keys: Sequence[str], seed: int) -> list[int]:
    """Rows of ``keys`` (in key order) sorted by their seeded order hash; equal hashes keep key order.

    Each key's place depends only on (seed, key), so adding keys never changes the relative order of the
    others.
    """
    encoded = "\0".join(keys).encode().split(b"\0")  # one encode for all keys
    if len(encoded) != len(keys):  # a key holding NUL (possible in a file list): encode one by one
        encoded = [key.encode() for key in keys]
    base = hashlib.blake2b(f"{seed}:".encode(), digest_size=8, person=ORDER_PERSON)
    digests = []
    for key in encoded:
        state = base.copy()  # cheaper than a fresh personalised hash per key
        state.update(key)
        digests.append(state.digest())
    hashes = np.frombuffer(b"".join(digests), dtype=">u8")
    order: list[int] = np.argsort(hashes, kind="stable").tolist()
    return order


def cut_shards(
    keys: Sequence[str], num_bytes: np.ndarray, *, max_samples: int | None, max_bytes: int | None
) -> list[slice]:
    """Cut samples (already in order) into runs of at most ``max_samples`` and ``max_bytes`` payload."""
    if max_bytes is not None and (too_big := np.flatnonzero(num_bytes > max_bytes)).size:
        first = int(too_big[0])
        raise SampleTooLargeError.of(keys[first], int(num_bytes[first]), max_bytes)
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


def fingerprint(parts: Sequence[tuple[str, SampleTable]], options: PackOptions) -> str:
    """Identifies a pack job: its output-shaping options and its planned work, each part (a shard, or a
    piece to map) by where it goes and what it holds (keys, paths or values, sizes)."""
    digest = hashlib.sha256(json.dumps(options.job_options(), sort_keys=True).encode())
    for relpath, samples in parts:
        digest.update(repr((relpath, samples.fields)).encode())
        for texts in (samples.keys, *samples.columns):
            try:  # keys and paths hold no NUL: joining is unambiguous, and faster than repr
                digest.update(b"\0" + "\0".join(texts).encode())  # type: ignore[arg-type]
            except TypeError:  # a column of literal bytes
                digest.update(b"\1" + repr(texts).encode())
        digest.update(samples.sizes.astype("<i8").tobytes())
    return digest.hexdigest()[:16]
