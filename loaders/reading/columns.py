"""A window's samples as columns, and the two ways a worker hands them out: per sample or per batch.

A window is read into columns (keys, one :mod:`~shardpipe.formats.bytecolumn` column per field, pad
flags). The per-sample path builds a dict per sample (what decoders and transforms take); the batch path,
used by ``make_loader`` when fields stay raw bytes, cuts the permuted columns straight into ``Batch``
objects (one ``RaggedBytes`` per field), the same batches the DataLoader would have collated from the
per-sample path, without a dict per sample or a collate call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from loaders.reading.decode import DecodeContext, DecodeError, FieldDecoder, decode_sample
from loaders.transfer.collate import Batch, RaggedBytes
from shardpipe.errors import DataError
from shardpipe.formats import bytecolumn
from shardpipe.formats.bytecolumn import ByteColumn

Sample = dict[str, object]


@dataclass(slots=True)
class Columns:
    """Samples as columns: ``keys[i]``, ``fields[name][i]`` and ``pads[i]`` describe sample i."""

    names: tuple[str, ...]
    keys: list[str] = field(default_factory=list)
    fields: dict[str, ByteColumn] = field(default_factory=dict)
    """One :mod:`~shardpipe.formats.bytecolumn` column per field, ``None`` where a sample lacks the field
    (foreign shards); such samples only travel one by one."""
    pads: list[bool] = field(default_factory=list)
    shards: list[int] = field(default_factory=list)
    """The shard each sample was read from (its index in the split), for messages; may be empty."""
    sources: list[int] = field(default_factory=list)
    """A mixture's source index of each sample (the ``__source__`` column); empty for one dataset."""

    def __post_init__(self) -> None:
        for name in self.names:
            if name not in self.fields:
                self.fields[name] = []

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def concat(cls, names: tuple[str, ...], pieces: Sequence[Columns]) -> Columns:
        """The samples of ``pieces`` one after another (each field copied once, whatever the count)."""
        joined = cls(names, [key for piece in pieces for key in piece.keys], {})
        joined.pads = [pad for piece in pieces for pad in piece.pads]
        if all(len(piece.shards) == len(piece) for piece in pieces):
            joined.shards = [shard for piece in pieces for shard in piece.shards]
        if pieces and all(len(piece.sources) == len(piece) for piece in pieces):
            joined.sources = [source for piece in pieces for source in piece.sources]
        for name in names:
            joined.fields[name] = bytecolumn.concat([piece.fields[name] for piece in pieces])
        return joined

    @classmethod
    def gather(cls, names: tuple[str, ...], pieces: Sequence[Columns], order: np.ndarray) -> Columns:
        """The samples at ``order`` of ``pieces`` one after another: ``concat`` then ``take``, with each
        field copied once instead of twice."""
        picks = order.tolist()
        keys = [key for piece in pieces for key in piece.keys]
        pads = [pad for piece in pieces for pad in piece.pads]
        fields = {
            name: bytecolumn.take_across([piece.fields[name] for piece in pieces], order) for name in names
        }
        gathered = cls(names, [keys[i] for i in picks], fields, [pads[i] for i in picks])
        if all(len(piece.shards) == len(piece) for piece in pieces):
            shards = [shard for piece in pieces for shard in piece.shards]
            gathered.shards = [shards[i] for i in picks]
        if pieces and all(len(piece.sources) == len(piece) for piece in pieces):
            sources = [source for piece in pieces for source in piece.sources]
            gathered.sources = [sources[i] for i in picks]
        return gathered

    def cut(self, start: int, stop: int) -> Columns:
        """Samples ``[start, stop)``, sharing these columns' memory."""
        fields = {name: bytecolumn.cut(column, start, stop) for name, column in self.fields.items()}
        keys, pads = self.keys[start:stop], self.pads[start:stop]
        return Columns(self.names, keys, fields, pads, self.shards[start:stop], self.sources[start:stop])

    def take(self, order: Sequence[int]) -> Columns:
        """The samples at ``order``, as new columns."""
        keys, fields = bytecolumn.in_order((self.keys, self.fields), order)
        shards = [self.shards[i] for i in order] if len(self.shards) == len(self) else []
        sources = [self.sources[i] for i in order] if self.sources and len(self.sources) == len(self) else []
        return Columns(self.names, keys, fields, [self.pads[i] for i in order], shards, sources)

    def samples(self) -> Iterator[Sample]:
        """One dict per sample, as the per-sample path yields them."""
        names = self.names
        fields = {name: bytecolumn.values(self.fields[name]) for name in names}
        sources = self.sources if len(self.sources) == len(self) and self.sources else None
        for i, key in enumerate(self.keys):
            sample: Sample = {name: value for name in names if (value := fields[name][i]) is not None}
            sample["__key__"] = key
            sample["__pad__"] = self.pads[i]
            if sources is not None:
                sample["__source__"] = sources[i]
            yield sample


def batches(windows: Iterable[Columns], batch_size: int, decoding: Decoding | None = None) -> Iterator[Batch]:
    """Cut consecutive windows (already in yield order) into batches of ``batch_size``; the last may be
    shorter. A batch may span two windows, exactly as the DataLoader's own batching would; only such a
    batch is copied together, every other one is cut from its window's columns without a copy. Fields
    with a decoder are decoded a whole batch column at a time (:class:`Decoding`)."""
    carry: Columns | None = None
    for window in windows:
        start = 0
        if carry is not None:
            start = min(batch_size - len(carry), len(window))
            carry = Columns.concat(window.names, [carry, window.cut(0, start)])
            if len(carry) < batch_size:
                continue
            yield to_batch(carry, 0, batch_size, decoding)
            carry = None
        while len(window) - start >= batch_size:
            yield to_batch(window, start, start + batch_size, decoding)
            start += batch_size
        if start < len(window):
            carry = window.cut(start, len(window))
    if carry is not None and len(carry):
        yield to_batch(carry, 0, len(carry), decoding)


@dataclass(slots=True)
class Decoding:
    """The decoders of a batch's fields and what they draw from; ``on_bad(n)`` counts samples a decoder
    could not decode under ``on_error="skip"`` (they become flagged pads)."""

    decoders: Mapping[str, FieldDecoder]
    context: DecodeContext
    shard_names: Sequence[str]
    on_bad: Callable[[int], None] = lambda count: None

    def column(
        self, name: str, column: RaggedBytes, keys: list[str], shards: list[int], pads: list[bool]
    ) -> Any:
        """The decoded column; a sample it could not decode (skipping) is flagged in ``pads``."""
        context = self.context
        context.failed.clear()
        try:
            value = self.decoders[name].column(column, keys, context)
        except DecodeError as exc:
            shard = self.shard_names[shards[exc.index]] if exc.index < len(shards) else "?"
            raise DecodeError.at(name, keys[exc.index], shard, exc.detail, exc.index) from exc
        for index, _ in context.failed:
            pads[index] = True
        if context.failed:
            self.on_bad(len(context.failed))
        return value


def to_batch(columns: Columns, start: int, stop: int, decoding: Decoding | None = None) -> Batch:
    batch = Batch()
    batch["__key__"] = columns.keys[start:stop]
    pads = columns.pads[start:stop]
    shards = columns.shards[start:stop]
    for name in columns.names:
        missing = bytecolumn.first_missing(columns.fields[name], start, stop)
        if missing is not None:
            key = columns.keys[missing]
            raise DataError(
                f"sample {key!r} has no field {name!r}, so its batch cannot hold it as one buffer; read "
                "this dataset with a collate_fn (make_loader(..., collate_fn=...)) or a transform"
            )
        raw = RaggedBytes(*bytecolumn.ragged(columns.fields[name], start, stop))
        if decoding is not None and name in decoding.decoders:
            batch[name] = decoding.column(name, raw, batch["__key__"], shards, pads)
        else:
            batch[name] = raw
    batch["__pad__"] = torch.from_numpy(np.array(pads, dtype=bool))
    if columns.sources and len(columns.sources) == len(columns):
        batch["__source__"] = torch.tensor(columns.sources[start:stop], dtype=torch.int64)
    return batch


def finished_samples(
    windows: Iterable[Columns],
    decoders: Mapping[str, FieldDecoder],
    transform: Callable[[Sample], Any] | None,
    context: DecodeContext,
    shard_paths: Sequence[str],
    count_error: Callable[[], None],
) -> Iterator[Any]:
    """The per-sample path's samples, decoded (``count_error()`` for each one skipped as undecodable, its
    shard named by ``shard_paths``) and transformed."""
    for window in windows:
        shards = window.shards if len(window.shards) == len(window) else [-1] * len(window)
        for sample, shard in zip(window.samples(), shards, strict=True):
            if decode_sample(sample, decoders, context, shard_paths[shard] if shard >= 0 else "?"):
                count_error()
            yield transform(sample) if transform is not None else sample
