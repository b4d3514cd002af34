"""LMDB shards: one single-file environment per shard, samples under 8-byte big-endian indices, values
:mod:`.framing` records (version 2: each with its checksum), never pickles.

The format's parts: :mod:`.lmdb_env` (keys, and the environments a process holds), :mod:`.lmdb_writer`,
:mod:`.lmdb_reader` (spans walked by key and decoded) and :mod:`.lmdb_window` (records landed from
LMDB's own map, small ones from one buffer they are copied into, and random gets).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from shardpipe.errors import UsageError
from shardpipe.formats.base import FormatBase, Offsets, RemoteBytes, ShardReader
from shardpipe.formats.landing import LANDED_MIN_BYTES
from shardpipe.formats.layout import SampleLayout
from shardpipe.formats.lmdb_env import INDEX
from shardpipe.formats.lmdb_reader import LmdbReader, Part
from shardpipe.formats.lmdb_window import JoinedRecords, LmdbWindow, read_samples
from shardpipe.formats.lmdb_writer import LmdbWriter
from shardpipe.formats.readbuffer import ReadBuffer


class LmdbFormat(FormatBase, format_name="lmdb"):
    def open_writer(self, path: Path) -> LmdbWriter:
        return LmdbWriter(path)

    def open_reader(
        self,
        path: Path,
        index: Offsets | None = None,
        *,
        check: bool = True,
        remote: RemoteBytes | None = None,
    ) -> LmdbReader:
        if remote is not None:
            raise UsageError(
                f"LMDB shard {remote.name} cannot be read by byte ranges (LMDB maps a local file); read it "
                "through the cache (cache=True)"
            )
        return LmdbReader(path, index, check=check)

    def locate(
        self,
        parts: Sequence[tuple[ShardReader, int, int]],
        names: Sequence[str],
        buffer: ReadBuffer,
        *,
        any_size: bool = False,
        scattered: bool = False,
    ) -> LmdbWindow | JoinedRecords | None:
        """Large records landed from LMDB's map, small ones copied into one buffer and landed there (one
        read transaction per shard, :func:`decode_parts`) or, scattered, one by one; ``None`` for shards
        of different framing versions or checks."""
        records = cast(Sequence[Part], parts)
        kinds = {(reader.version, reader.check) for reader, _, _ in records}
        if len(kinds) != 1:
            return None
        version, check = kinds.pop()
        reader, start, _ = records[0]
        with reader.begin() as txn:
            first = txn.get(INDEX.pack(start))
            if first is None:
                return None  # missing: the general path names it
            if len(first) < LANDED_MIN_BYTES and not any_size:  # too small to gain
                if scattered:
                    return LmdbWindow(records, names, version=version, check=check, one_by_one=True)
                return JoinedRecords(records, names, buffer, version=version, check=check)
        return LmdbWindow(records, names, version=version, check=check)

    def read_samples(
        self, readers: Mapping[int, ShardReader], picks: Sequence[tuple[int, int]], names: Sequence[str]
    ) -> list[dict[str, Any]] | None:
        return read_samples(cast(Mapping[int, LmdbReader], readers), picks, names)

    def scan(self, path: Path) -> tuple[list[str], list[SampleLayout], int]:
        with LmdbReader(path) as reader:
            return reader.scan()


FORMAT = LmdbFormat()
