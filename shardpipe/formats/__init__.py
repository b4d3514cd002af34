"""Shard formats behind one small interface (:mod:`.base`), and the registry that names them.

Each format module holds its writer and its reader (:mod:`.tar`, :mod:`.lmdb`, :mod:`.tfrecord`) and
exposes one ``FORMAT`` object; :func:`get_format` imports only the module asked for, so a pack pays for
its own format's libraries, not everyone's.

Inside, imports point one way: the leaves (:mod:`.terms`, the shared words; :mod:`.readbuffer`;
:mod:`.checksums`, the per-sample checksum and the one check of many samples; :mod:`.leases`, buffers
reused once nothing cut from them is left), then
the columns (:mod:`.bytecolumn`), the index (:mod:`.layout`) and the slicing by it (:mod:`.cutting`), then
the interface (:mod:`.base`) and the readers and writers built on it, with their parts: :mod:`.landing`
(the one kernel that turns located samples into columns, every byte checked), :mod:`.mapped` (large
samples located in a memory map of their shard), :mod:`.spanreader` (spans of samples read by byte offset,
for tar and TFRecord), :mod:`.joined` (small samples of several shards read into one buffer, to be gathered
together), :mod:`.tarparse`
(tar bytes parsed into samples), :mod:`.tf_example` (the ``tf.train.Example`` protobuf, by hand),
:mod:`.framing` (the record layout of LMDB values), LMDB's parts (:mod:`.lmdb_env`, its keys and the
environments a process holds; :mod:`.lmdb_writer`; :mod:`.lmdb_reader`, spans walked by key;
:mod:`.lmdb_window`, records landed from LMDB's map or, small, from one buffer) and
:mod:`.compression` (per-sample compression of a field's values: what is stored), with its pack side
:mod:`.compressor` and its read side :mod:`.decompressor`.

Part of the shared core (``shardpipe.manifest``, ``.shardtable``, ``.errors``, ``.formats``, ``.storage``,
``.units``), which the pack stage (``shardpipe.packing``) and the loaders (``loaders``) both stand on: it
imports neither of them, nor the sources, tools or CLI (the import-linter contracts in pyproject.toml, run
by ``make lint``).
"""

from __future__ import annotations

import importlib
from typing import cast

from shardpipe.errors import UsageError
from shardpipe.formats.base import FORMAT_INFO, Format, FormatInfo

FORMAT_NAMES = tuple(sorted(FORMAT_INFO))

__all__ = ["FORMAT_INFO", "FORMAT_NAMES", "Format", "FormatInfo", "format_info", "get_format"]


def format_info(name: str) -> FormatInfo:
    """The registry's facts of format ``name`` (``tar``, ``lmdb`` or ``tfrecord``), without importing it."""
    if name not in FORMAT_INFO:
        raise UsageError(f"unknown format {name!r}; choose one of {', '.join(FORMAT_NAMES)}")
    return FORMAT_INFO[name]


def get_format(name: str) -> Format:
    """The format registered under ``name``; only that format's module is imported."""
    module = importlib.import_module(f"shardpipe.formats.{format_info(name).name}")
    return cast(Format, module.FORMAT)


def all_formats() -> dict[str, Format]:
    return {name: get_format(name) for name in FORMAT_NAMES}
