"""``DatasetWriter``: samples produced in Python (a database, a Hugging Face dataset, generated data)
written as a packed dataset, with the manifest, indexes and per-sample checksums a pack writes.

::

    with DatasetWriter("out/", format="tar", max_samples=10_000) as writer:
        for row in rows:
            writer.write({"__key__": row.id, "jpg": row.image, "cls": b"%d" % row.label}, split="train")

Samples are checked like a map's outputs (:mod:`.samples`: key rules, bytes values, one field set, unique
keys) and go to their split's current shard, in the order written; a shard is cut by ``max_samples`` and
``max_bytes`` of payload like a pack's, then published whole (staged, index first, checked). The manifest
is written when the block ends without an error, and only then: an interrupted writer leaves finished
shards and a journal, never a manifest or a partial shard under a final name. OUT may be a URL.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from shardpipe.errors import UsageError
from shardpipe.formats import format_info
from shardpipe.formats.compression import SAMPLE_BYTES, SAMPLE_COUNT, parse_compress
from shardpipe.manifest import Manifest
from shardpipe.packing.compressing import Compression, plan_compression
from shardpipe.packing.output import Job, Output
from shardpipe.packing.plan import SampleTooLargeError
from shardpipe.packing.samples import SampleError, check_sample
from shardpipe.packing.shard_writing import ShardFile
from shardpipe.packing.split import check_split_name
from shardpipe.shardtable import ShardEntry, ShardTable
from shardpipe.storage import as_location, open_writable_store

DEFAULT_MAX_BYTES = 256_000_000


class DatasetWriter:
    """Shards and a manifest from samples written one by one; see the module docstring."""

    def __init__(
        self,
        out: str | os.PathLike[str],
        format: str = "tar",
        *,
        split: str = "train",
        max_samples: int | None = None,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        overwrite: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        compress: str | None = None,
        compress_fields: Sequence[str] = (),
    ) -> None:
        """``compress`` and ``compress_fields`` as :class:`~shardpipe.packing.PackOptions`' (the
        dictionaries are trained on the first samples written, held until then)."""
        self._suffix = format_info(format).suffix
        self.format, self.split = format, check_split_name(split)
        for name, limit in (("max_samples", max_samples), ("max_bytes", max_bytes)):
            if limit is not None and limit < 1:
                raise UsageError(f"{name} must be at least 1, got {limit}")
        self.max_samples, self.max_bytes = max_samples, max_bytes
        store = open_writable_store(as_location(out), storage_options=storage_options, action="write to")
        self._output = Output(store)
        self._job_options: dict[str, Any] = {
            "format": format,
            "max_samples": max_samples,
            "max_bytes": max_bytes,
        }
        self._spec = parse_compress(compress)
        self._compress_fields = tuple(compress_fields)
        if self._compress_fields and self._spec is None:
            raise UsageError("compress_fields names the fields to compress: give compress too")
        if self._spec is not None:
            self._job_options["compress"] = self._spec.to_json()
            self._job_options["compress_fields"] = list(self._compress_fields)
        self._compression: Compression | None = None
        self._pending: list[tuple[str, str, dict[str, bytes], int]] | None = [] if self._spec else None
        self._pending_bytes = 0
        self._output.prepare(
            Job("python-writer", self._job_options, "python"), resume=False, overwrite=overwrite
        )
        self._fields: tuple[str, ...] | None = None
        self._keys: set[str] = set()
        self._open: dict[str, tuple[ShardFile, int]] = {}  # split -> (its shard, payload bytes in it)
        self._entries: dict[str, list[ShardEntry]] = {}
        self._closed = False
        self.manifest: Manifest | None = None

    def write(self, sample: Mapping[str, Any], *, split: str | None = None) -> None:
        """Append ``sample`` to ``split`` (default: the writer's)."""
        if self._closed:
            raise UsageError("this DatasetWriter is closed")
        split = self.split if split is None else check_split_name(split)
        key, fields = check_sample(sample)
        names = tuple(sorted(fields))
        if self._fields is None:
            self._fields = names
        elif names != self._fields:
            raise SampleError(
                f"sample {key!r} has fields {', '.join(names)}, the first one written "
                f"{', '.join(self._fields)}; every sample must have the same fields"
            )
        if key in self._keys:
            raise SampleError(f"key {key!r} was written before; keys must be unique")
        size = sum(map(len, fields.values()))
        if self.max_bytes is not None and size > self.max_bytes:
            raise SampleTooLargeError.of(key, size, self.max_bytes)
        self._keys.add(key)
        if self._pending is not None:  # held until the compression dictionaries are trained on them
            self._pending.append((split, key, fields, size))
            self._pending_bytes += size
            if len(self._pending) >= SAMPLE_COUNT or self._pending_bytes >= SAMPLE_BYTES:
                self._start_compression()
            return
        self._add(split, key, fields, size)

    def _add(self, split: str, key: str, fields: dict[str, bytes], size: int) -> None:
        shard, held = self._shard(split, size)
        shard.add(key, [fields[name] for name in shard.fields], size)
        self._open[split] = (shard, held + size)

    def _start_compression(self) -> None:
        """Train the dictionaries on the samples held, then write those samples."""
        pending, self._pending = self._pending or [], None
        if self._spec is None or self._fields is None:
            return
        samples = {name: [fields[name] for _, _, fields, _ in pending] for name in self._fields}
        self._compression = plan_compression(
            self._spec, self._fields, self._compress_fields, samples, self.max_bytes, self._output.store
        )
        for split, key, fields, size in pending:
            self._add(split, key, fields, size)

    def _shard(self, split: str, size: int) -> tuple[ShardFile, int]:
        """The split's shard that takes a sample of ``size`` bytes: the open one, or a new one after it is
        finished (the greedy cut of a pack: a shard holds what fits, its first sample always)."""
        if split in self._open:
            shard, held = self._open[split]
            full = self.max_samples is not None and shard.num_samples >= self.max_samples
            if not full and (self.max_bytes is None or held + size <= self.max_bytes):
                return shard, held
            self._finish(split)
        entries = self._entries.setdefault(split, [])
        relpath = f"{split}/shard-{len(entries):06d}{self._suffix}"
        compressor = None if self._compression is None else self._compression.compressor
        fields = self._fields or ()
        return ShardFile(relpath, self._output.store, self.format, fields, compressor=compressor), 0

    def _finish(self, split: str) -> None:
        shard, _ = self._open.pop(split)
        entry = shard.finish()
        self._output.record(entry)
        self._entries[split].append(entry)

    def close(self) -> Manifest:
        """Finish every shard and commit the manifest (last): the dataset is complete from here on."""
        if self.manifest is not None:
            return self.manifest
        if not self._keys:
            raise UsageError("nothing was written: a dataset needs at least one sample")
        if self._pending is not None:
            self._start_compression()
        for split in list(self._open):
            self._finish(split)
        self._closed = True
        digest = hashlib.sha256()
        for split, entries in self._entries.items():
            for entry in entries:
                digest.update(f"{split}:{entry.path}:{entry.sha256}".encode())
        job = Job(digest.hexdigest()[:16], self._job_options, "python")
        self.manifest = Manifest(
            format=self.format,
            fields=self._fields or (),
            splits={name: ShardTable.of(entries) for name, entries in self._entries.items()},
            split_rule={"method": "given by the writer, per sample"},
            source={"kind": "python"},
            shard_limits={"max_samples": self.max_samples, "max_bytes": self.max_bytes},
            order={"method": "written", "rule": "the order samples were written in"},
            job=job.to_json(),
            compression={} if self._compression is None else self._compression.codecs,
        )
        self._output.commit(self.manifest)
        return self.manifest

    def abort(self) -> None:
        """Drop the shards being written (finished ones and the journal stay; no manifest is written)."""
        self._closed = True
        for shard, _ in self._open.values():
            shard.abort()
        self._open.clear()

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()
