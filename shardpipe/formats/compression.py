"""Per-sample compression of a field's values (``pack --compress zstd[:LEVEL]``): what is stored and how the
manifest records it; :mod:`.compressor` writes the frames and trains the dictionaries, :mod:`.decompressor`
reads them back.

A compressed field's stored value is one zstd frame per sample, with its content size written in the frame
header and no frame checksum (the per-sample checksum covers the stored bytes already, and ``verify``
checks those without decompressing). Small records get a dictionary trained per pack and field from a
deterministic sample of the data, stored at ``compression/<field>.zdict`` beside the manifest, which
records its sha256. Fields of kinds that are compressed already (JPEG, PNG, MP4, gzip, ...) are left
alone unless named in the field list.

Part of the shared core: the pack stage compresses with it and the loaders decompress with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from shardpipe.errors import UsageError

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
