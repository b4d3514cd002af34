"""Compressed fields on read: a dataset's decoders, loaded once per process from its manifest and
dictionaries (:mod:`shardpipe.formats.compression` holds the codec and :class:`FieldCodecs`).

Every reader of samples calls ``field_codecs(source)`` once and then
``codecs.decode_columns(keys, fields, shard, indexes)`` on what ``ShardReader.read_runs`` (or a window's
landing, ``Format.locate``) returned, before the values go anywhere else: the streaming loaders do it in
:class:`~loaders.reading.windows.WindowReader`, so both the batch and the per-sample path see the values
as they were packed.
"""

from __future__ import annotations

from loaders.reading.source import DatasetSource
from shardpipe.formats.decompressor import CompressedFieldError, FieldCodecs

__all__ = ["CompressedFieldError", "FieldCodecs", "field_codecs"]


def field_codecs(source: DatasetSource) -> FieldCodecs | None:
    """The decoders of ``source``'s compressed fields (None when it stores none compressed), their
    dictionaries read from the dataset (local or remote) and checked against the manifest's sha256."""
    return FieldCodecs.load(source.manifest.compression, source.read_file, source.display)
