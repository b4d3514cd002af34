"""Per-sample compression of a field's values (``pack --compress zstd[:LEVEL]``): the codec choice, the
frames and dictionaries, and the one place values are decompressed on read (:class:`FieldCodecs`).

A compressed field's stored value is one zstd frame per sample, with its content size written in the frame
header and no frame checksum (the per-sample checksum covers the stored bytes already, and ``verify``
checks those without decompressing). Small records get a dictionary trained per pack and field from a
deterministic sample of the data (:func:`train_dictionary`), stored at ``compression/<field>.zdict``
beside the manifest, which records its sha256. Fields of kinds that are compressed already (JPEG, PNG,
MP4, gzip, ...) are left alone unless named in the field list.

On read a frame is refused before anything is allocated for it when its header claims no content size or
more than the field's bound (the manifest's ``max_bytes``): a damaged frame cannot make a reader allocate
without limit. A frame that does not decompress is a :class:`CompressedFieldError` naming shard, sample,
key and field, a :class:`~shardpipe.errors.CorruptShardError` like any unreadable sample.

Part of the shared core: the pack stage compresses with it and the loaders decompress with it.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zstandard

from shardpipe.errors import CorruptShardError, DataError, UsageError
from shardpipe.formats.bytecolumn import ARROW_MAX_MEAN_BYTES, ByteColumn, values

CODECS = ("zstd",)
DEFAULT_LEVEL = 3
MAX_LEVEL = 22  # zstd's levels 1..22 (its negative "fast" levels are not offered)
_KINDS = "jpg jpeg png webp gif avif heic jxl tif tiff mp3 mp4 m4a m4v mkv mov webm avi ogg opus flac aac"
PRECOMPRESSED = frozenset(f"{_KINDS} gz tgz zst zstd zip bz2 xz lz4 br 7z rar npz parquet".split(" "))
"""Field kinds (the last part of a field name, ``jpg`` in ``thumb.jpg``) that compress no further."""
DICTIONARY_FOLDER = "compression"
DICTIONARY_MEAN_BYTES = 16 * 1024
"""A field whose sampled values are at most this long on average gets a dictionary (zstd gains little
from one on larger values, and loses much without one on small values)."""
DICTIONARY_BYTES = 32 * 1024
MAX_DICTIONARY_BYTES = 1 << 20
"""A dictionary file longer than this is refused unread (shardpipe trains them at ``DICTIONARY_BYTES``)."""
SAMPLE_COUNT = 2000
SAMPLE_BYTES = 8 << 20
"""The training sample: at most this many values, and about this many bytes, of each field."""
FRAME_LIMIT = 1 << 30
"""The largest value a frame may claim when the pack had no ``max_bytes`` to bound its samples."""
DECODE_CHUNK_BYTES = 64 << 20
"""Frames are decompressed together in groups claiming at most this much (one frame at least)."""


@dataclass(frozen=True, slots=True)
class CompressSpec:
    """What ``--compress`` asked for: a codec and its level."""

    codec: str = "zstd"
    level: int = DEFAULT_LEVEL

    def to_json(self) -> str:
        return f"{self.codec}:{self.level}"


def parse_compress(text: str | CompressSpec | None) -> CompressSpec | None:
    """``"zstd"`` or ``"zstd:LEVEL"`` (or ``None``/``"none"``: no compression); anything else is a
    :class:`UsageError` saying what is accepted."""
    if text is None or isinstance(text, CompressSpec):
        return text
    if not isinstance(text, str):
        raise UsageError(f"compress must be 'zstd' or 'zstd:LEVEL', got {text!r}")
    if text.strip().lower() == "none":
        return None
    codec, colon, level_text = text.strip().partition(":")
    if codec not in CODECS:
        raise UsageError(f"compress codec {codec!r} is not supported; use one of: {', '.join(CODECS)}")
    if not colon:
        return CompressSpec(codec)
    try:
        level = int(level_text)
    except ValueError:
        level = 0
    if not 1 <= level <= MAX_LEVEL or not level_text.strip().isdigit():
        raise UsageError(f"compress level {level_text!r} is not a zstd level 1..{MAX_LEVEL}")
    return CompressSpec(codec, level)


def chosen_fields(fields: Iterable[str], given: Sequence[str] | None) -> tuple[str, ...]:
    """The fields to compress: ``given`` (the field list), else every field whose kind is not in
    :data:`PRECOMPRESSED`. A field list naming a field the data lacks is a :class:`UsageError`."""
    fields = tuple(fields)
    if given:
        unknown = [name for name in given if name not in fields]
        if unknown:
            raise UsageError(
                f"compress_fields names {', '.join(unknown)}, not fields of this data ({', '.join(fields)})"
            )
        return tuple(name for name in fields if name in given)
    return tuple(name for name in fields if name.rsplit(".", 1)[-1].lower() not in PRECOMPRESSED)


def dictionary_path(name: str) -> str:
    """Where a field's dictionary is stored, relative to the dataset root."""
    return f"{DICTIONARY_FOLDER}/{name}.zdict"


def train_dictionary(samples: Sequence[bytes], level: int) -> bytes | None:
    """A zstd dictionary for ``samples`` (a field's sampled values), or None where one would not help
    (large values, or too few or too uniform to train on). Deterministic: the same samples give the same
    bytes on any machine (zstd's trainer is a pure function of its input, run single-threaded, and the
    dictionary's id is a hash of its content)."""
    given: list[bytes | bytearray | memoryview] = [bytes(s) for s in samples if len(s)]
    if len(given) < 8 or sum(map(len, given)) > DICTIONARY_MEAN_BYTES * len(given):
        return None
    try:
        trained = zstandard.train_dictionary(DICTIONARY_BYTES, given, level=level, threads=0)
    except zstandard.ZstdError:
        return None  # zstd found nothing to train on (too little data, or values all alike)
    data: bytes = trained.as_bytes()
    return data


@dataclass(frozen=True, slots=True)
class FieldCodec:
    """How one field is stored, as the manifest records it."""

    codec: str
    level: int
    max_bytes: int
    """The largest value a frame may claim (the pack's ``max_bytes``, or :data:`FRAME_LIMIT`)."""
    dictionary: str | None = None
    dictionary_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"codec": self.codec, "level": self.level, "max_bytes": self.max_bytes}
        if self.dictionary is not None:
            out["dictionary"] = {"path": self.dictionary, "sha256": self.dictionary_sha256}
        return out

    @classmethod
    def from_json(cls, data: Any, name: str) -> FieldCodec:
        """Parse one field's entry; raises ``ValueError`` saying what is wrong."""
        if not isinstance(data, dict) or data.get("codec") not in CODECS:
            raise ValueError(f"compression of field {name!r} is {data!r:.80}, expected a zstd codec entry")
        level, limit = data.get("level"), data.get("max_bytes")
        if not isinstance(level, int) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"compression of field {name!r}: level and max_bytes must be integers")
        found = data.get("dictionary")
        if found is not None and (
            not isinstance(found, dict)
            or not isinstance(found.get("path"), str)
            or not isinstance(found.get("sha256"), str)
        ):
            raise ValueError(f"compression of field {name!r}: its dictionary needs a path and a sha256")
        return cls(
            data["codec"],
            level,
            limit,
            None if found is None else found["path"],
            None if found is None else found["sha256"],
        )


@dataclass(slots=True)
class FieldCompressor:
    """The pack side: compresses the chosen fields' values of a batch. Pickles as its settings and
    dictionaries (any executor runs it); the zstd contexts are made on first use, in the process that
    uses them."""

    level: int
    dictionaries: dict[str, bytes | None]
    """Each compressed field's dictionary (None: none)."""
    _contexts: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __getstate__(self) -> tuple[int, dict[str, bytes | None]]:
        return self.level, self.dictionaries

    def __setstate__(self, state: tuple[int, dict[str, bytes | None]]) -> None:
        self.level, self.dictionaries = state
        self._contexts = {}

    def compress_column(self, name: str, column: Iterable[Any]) -> list[Any]:
        """The values of field ``name``, compressed when it is one of the compressed fields."""
        if name not in self.dictionaries:
            return list(column)
        context = self._contexts.get(name)
        if context is None:
            data = self.dictionaries[name]
            context = self._contexts[name] = zstandard.ZstdCompressor(
                level=self.level,
                dict_data=None if data is None else zstandard.ZstdCompressionDict(data),
                write_checksum=False,
                write_content_size=True,
                write_dict_id=True,
            )
        return [None if value is None else context.compress(value) for value in column]

    def compress(self, names: Sequence[str], columns: Sequence[Iterable[Any]]) -> list[list[Any]]:
        """A writer batch's columns (one per name), the compressed fields' values as frames."""
        return [self.compress_column(name, column) for name, column in zip(names, columns, strict=True)]


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
