"""The read side of field compression (:mod:`.compression`): the one place stored frames are decompressed.

A frame is refused before anything is allocated for it when its header claims no content size or more than
the field's bound (the manifest's ``max_bytes``): a damaged frame cannot make a reader allocate without
limit. A frame that does not decompress is a :class:`CompressedFieldError` naming shard, sample, key and
field, a :class:`~shardpipe.errors.CorruptShardError` like any unreadable sample.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import zstandard

from shardpipe.errors import CorruptShardError, DataError
from shardpipe.formats.bytecolumn import ARROW_MAX_MEAN_BYTES, ByteColumn, values
from shardpipe.formats.compression import DECODE_CHUNK_BYTES, FieldCodec


class CompressedFieldError(CorruptShardError):
    """A stored frame (or its dictionary) does not decompress: names shard, sample, key and field."""


class FieldCodecs:
    """The read side: each compressed field's decompressor, its dictionary loaded and checked once.

    :meth:`decode_columns` is the one place stored values are decompressed: the streaming loaders call
    it where read bytes become columns, and a map-style reader calls it on what
    ``ShardReader.read_runs`` returns."""

    def __init__(self, codecs: Mapping[str, FieldCodec], dictionaries: Mapping[str, bytes | None]) -> None:
        self.codecs = dict(codecs)
        self._dictionaries = {name: dictionaries.get(name) for name in self.codecs}
        self._local = threading.local()  # a zstd context serves one thread at a time: one per thread

    def _decompressor(self, name: str) -> Any:
        """This thread's decompressor of field ``name``, made on first use."""
        made: dict[str, Any] | None = getattr(self._local, "decompressors", None)
        if made is None:
            made = self._local.decompressors = {}
        if name not in made:
            data = self._dictionaries[name]
            made[name] = zstandard.ZstdDecompressor(
                dict_data=None if data is None else _dictionary(data, name)
            )
        return made[name]

    @classmethod
    def load(
        cls, codecs: Mapping[str, FieldCodec], read: Callable[[str], bytes], where: str = ""
    ) -> FieldCodecs | None:
        """The decoders of a dataset whose manifest records ``codecs`` (None when it compresses nothing),
        its dictionaries read by ``read(relpath)`` and checked against their sha256; a missing or damaged
        dictionary is a :class:`DataError` naming it (``where``: the dataset, for messages)."""
        if not codecs:
            return None
        dictionaries: dict[str, bytes | None] = {}
        for name, codec in codecs.items():
            if codec.dictionary is None:
                dictionaries[name] = None
                continue
            shown = f"{where}/{codec.dictionary}" if where else codec.dictionary
            try:
                data = read(codec.dictionary)
            except (OSError, DataError) as exc:
                raise DataError(f"cannot read the dictionary of field {name!r} at {shown}: {exc}") from exc
            if hashlib.sha256(data).hexdigest() != codec.dictionary_sha256:
                raise CompressedFieldError(
                    f"corrupt dictionary {shown} of field {name!r}: its sha256 does not match the "
                    "manifest's; run `shardpipe verify`"
                )
            dictionaries[name] = data
        return cls(codecs, dictionaries)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.codecs)

    def decode_columns(
        self,
        keys: Sequence[str],
        fields: Mapping[str, ByteColumn],
        shard: str | Sequence[str] | np.ndarray,
        indexes: Sequence[int] | np.ndarray | None = None,
    ) -> dict[str, ByteColumn]:
        """``fields`` (name -> :mod:`~shardpipe.formats.bytecolumn` column, ``keys[i]`` sample i's key)
        with the compressed ones decompressed; the others are passed through as they are. ``shard`` names
        the shard the samples were read from (or each sample's shard: a sequence or a NumPy array),
        ``indexes`` their positions in it (a sequence or an array), for errors. Small values come back as
        an Arrow array, as the readers cut them."""
        out = dict(fields)
        for name, column in fields.items():
            if name in self.codecs:
                out[name] = self._decode(name, column, keys, shard, indexes)
        return out

    def _decode(
        self,
        name: str,
        column: ByteColumn,
        keys: Sequence[str],
        shard: str | Sequence[str] | np.ndarray,
        indexes: Sequence[int] | np.ndarray | None,
    ) -> ByteColumn:
        frames = values(column)
        if not frames:
            return column
        limit = self.codecs[name].max_bytes
        whole = None not in frames
        present = range(len(frames)) if whole else [i for i, frame in enumerate(frames) if frame is not None]
        stored: list[Any] = frames if whole else [frames[i] for i in present]
        claims = self._claims(
            name, stored, limit, lambda k, detail: (present[k], detail), keys, shard, indexes
        )
        ends = np.cumsum(claims, dtype=np.int64)
        groups = []
        start = 0
        while start < len(stored):  # groups claiming at most DECODE_CHUNK_BYTES (one frame at least)
            before = int(ends[start - 1]) if start else 0
            stop = max(start + 1, int(np.searchsorted(ends, before + DECODE_CHUNK_BYTES, side="right")))
            total = int(ends[stop - 1]) - before
            groups.append(self._group(name, stored, start, stop, total, limit, present, keys, shard, indexes))
            start = stop
        data = groups[0] if len(groups) == 1 else b"".join(groups)
        offsets = np.concatenate([[0], ends])
        if whole and int(ends[-1]) <= ARROW_MAX_MEAN_BYTES * len(frames):  # as the readers cut small values
            import pyarrow

            pieces = [None, pyarrow.py_buffer(offsets), pyarrow.py_buffer(data)]
            return pyarrow.LargeBinaryArray.from_buffers(pyarrow.large_binary(), len(frames), pieces)
        view = memoryview(data)
        spans = zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
        made = [bytes(view[first:last]) for first, last in spans]
        if whole:
            return made
        decoded: list[bytes | None] = [None] * len(frames)
        for i, value in zip(present, made, strict=True):
            decoded[i] = value
        return decoded

    def _claims(
        self,
        name: str,
        stored: list[Any],
        limit: int,
        where: Callable[[int, str], tuple[int, str]],
        keys: Sequence[str],
        shard: str | Sequence[str] | np.ndarray,
        indexes: Sequence[int] | np.ndarray | None,
    ) -> list[int]:
        """The content size each frame's header claims, checked against ``limit`` before anything is
        allocated for it: a frame without one, or claiming more, is an error."""
        try:
            claims = [zstandard.frame_content_size(frame) for frame in stored]
            if min(claims) >= 0 and max(claims) <= limit:
                return claims
        except zstandard.ZstdError:
            pass
        for k, frame in enumerate(stored):  # find the first bad one
            try:
                claimed = zstandard.frame_content_size(frame)
            except zstandard.ZstdError:
                claimed = -2  # not a frame header at all
            if not 0 <= claimed <= limit:
                detail = (
                    "not a zstd frame with its content size"
                    if claimed < 0
                    else f"its frame claims {claimed:,} bytes, more than the bound {limit:,}"
                )
                raise self._error(name, *where(k, detail), keys, shard, indexes)
        raise AssertionError("unreachable: a frame failed the check")  # pragma: no cover

    def _group(
        self,
        name: str,
        stored: list[Any],
        start: int,
        stop: int,
        total: int,
        limit: int,
        present: Sequence[int],
        keys: Sequence[str],
        shard: str | Sequence[str] | np.ndarray,
        indexes: Sequence[int] | np.ndarray | None,
    ) -> bytes | bytearray:
        """Frames ``stored[start:stop]``, which claim ``total`` bytes, decompressed back to back into one
        buffer of that size (one streaming call across the frames; zstd checks each frame's output
        against the size its header claims). Anything else (an error, more output than claimed) is
        found again frame by frame, which names the bad frame."""
        decompressor = self._decompressor(name)
        joined = b"".join(stored[start:stop])
        out = bytearray(total)
        try:
            reader = decompressor.stream_reader(joined, read_size=len(joined) + 1, read_across_frames=True)
            view, filled = memoryview(out), 0
            while filled < total and (count := reader.readinto(view[filled:])):
                filled += count
            if filled == total and not reader.read(1):
                return out
        except zstandard.ZstdError:
            pass
        made = []
        for k in range(start, stop):
            try:
                made.append(decompressor.decompress(stored[k], max_output_size=limit, allow_extra_data=False))
            except zstandard.ZstdError as exc:
                raise self._error(name, present[k], f"bad zstd frame: {exc}", keys, shard, indexes) from None
        if sum(map(len, made)) != total:  # pragma: no cover - zstd checks each frame against its claim
            raise self._error(name, present[start], "frames disagree with their sizes", keys, shard, indexes)
        return b"".join(made)

    def _error(
        self,
        name: str,
        i: int,
        detail: str,
        keys: Sequence[str],
        shard: str | Sequence[str] | np.ndarray,
        indexes: Sequence[int] | np.ndarray | None,
    ) -> CompressedFieldError:
        where = shard if isinstance(shard, str) else str(shard[i])
        index = None if indexes is None else int(indexes[i])
        key = keys[i] if i < len(keys) else "?"
        message = f"field {name!r} of sample {key!r} does not decompress: {detail}"
        error = CorruptShardError.at(where, message, sample_index=index)
        return CompressedFieldError(
            str(error), shard=where, detail=message, sample_index=index, offset=error.offset
        )


def _dictionary(data: bytes | None, name: str) -> Any:
    try:
        return zstandard.ZstdCompressionDict(data or b"")
    except zstandard.ZstdError as exc:  # pragma: no cover - the sha256 was checked before
        raise CompressedFieldError(f"the dictionary of field {name!r} does not load: {exc}") from None
