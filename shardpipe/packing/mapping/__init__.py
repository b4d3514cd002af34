"""Packing with a transform (a user map, the image preparation: :mod:`shardpipe.packing.transform`): its
two steps, one module each, and the error and output checks both use.

The sizes of a map's outputs are unknown until it has run, so the plan has two steps, and the cut of
shards stays a pure function of the ordered outputs whatever runs the work:

1. **Pieces** (:mod:`.pieces`). The inputs are cut into pieces by the pack's own shard plan (the shards
   a pack without a map would write), each split in equal parts when the job would have fewer than
   :data:`~.pieces.MIN_PIECES` (so a costly map still spreads over several workers): a function of the
   inputs and options, never of the worker count. One task maps one piece in order
   (:func:`~.pieces.map_piece`), checks every output and writes the outputs, in the dataset's format, as
   a staged shard under ``OUT/.shardpipe-staging/``; its result (:class:`~.pieces.MappedPiece`: each
   output's key and size, the staged shard's entry) is journaled, so a resume keeps finished pieces.
2. **Shards** (:mod:`.shards`). The outputs of each split, in order, are cut into shards by the rule a
   pack without a map uses (``max_samples``, ``max_bytes`` of payload), across pieces. A shard that holds
   exactly one piece's outputs is that piece's staged shard, moved into place (no byte written twice: a
   map that keeps sizes, such as one that changes no sample, costs only itself); any other is written
   from the staged shards it spans, read and checked like any shard (:func:`~.shards.write_mapped_shard`).
   Either way its bytes are the same: writers get the same batches
   (:meth:`~shardpipe.packing.shard_writing.ShardFile.add`). What is left staged goes once the manifest
   is in place.

For a source (files), the inputs are split and ordered before the map, and their outputs keep that
split and order: a map whose outputs equal its inputs writes the shards of no map, byte for byte.
Inputs given in Python (:mod:`shardpipe.packing.items`) have no key until mapped: each one's outputs go
to the split (and the place in the order) that the key of its first output picks.

A failing input stops the pack naming it, its source files and the function's error, unless
``on_error="skip"``: then it is left out, counted and named (with a one-line error) in the manifest.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardpipe.errors import DataError


class MapError(DataError):
    """The map failed on an input (and ``on_error`` is ``raise``), or its outputs disagree; the message
    names the input, its source files and the function's own error."""

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key


def fields_differ(key: str, fields: Sequence[str], other: str, others: Sequence[str]) -> MapError:
    """The error for output ``key`` whose ``fields`` are not those of the earlier output ``other``."""
    message = (
        f"the map returned fields {', '.join(fields)} for {key!r} but {', '.join(others)} for {other!r}; "
        "every sample must have the same fields"
    )
    return MapError(message, key=key)


def check_unique_keys(keys: Sequence[str]) -> None:
    """Raise :class:`MapError` naming the first key that ``keys`` holds twice."""
    if len(set(keys)) == len(keys):
        return
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise MapError(f"the map returned the key {key!r} twice; keys must be unique", key=key)
        seen.add(key)
