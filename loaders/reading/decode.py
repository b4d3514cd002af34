"""Field decoders, chosen by the field's extension. Nothing is ever unpickled.

``decode=None`` keeps raw bytes (fastest; decode in ``transform`` or on the GPU). ``decode="auto"`` decodes
every field whose last extension is known; a mapping names a decoder (a built-in name, a callable, or a
:class:`ColumnDecoder`) per field.

Every built-in decoder has two forms: one for a whole batch column (the batch path: one call per batch,
no dict per sample) and one for a sample (the per-sample path, taken when a ``transform`` or a per-sample
callable is given). Both give the same values: ``cls`` and ``index`` one int64 tensor, parsed in one
vectorised call; ``txt`` a list of ``str``; ``json`` a list of objects; ``npy`` and images a stacked tensor
when the shapes agree (else a list). A :class:`ColumnDecoder` (the fused image crops of
:mod:`loaders.images.crops`, or :func:`column_decoder` around a function of your own) takes the column,
the batch's keys and a :class:`DecodeContext` (seed and epoch, for draws that must be the same on a
resume).
"""

from __future__ import annotations

import io
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from loaders.transfer.collate import RaggedBytes
from shardpipe.errors import DataError

Decoder = Callable[[bytes], Any]
"""A per-sample decoder: one field's bytes -> its value."""


class DecodeError(DataError):
    """A sample's field could not be decoded: the message names the field, the sample and its shard."""

    def __init__(self, message: str, *, index: int = 0, detail: str = "") -> None:
        super().__init__(message)
        self.index, self.detail = index, detail

    @classmethod
    def at(cls, name: str, key: str, shard: str, detail: str, index: int = 0) -> DecodeError:
        message = f"cannot decode field {name!r} of sample {key!r} (shard {shard}): {detail}"
        return cls(message, index=index, detail=detail)


@dataclass(slots=True)
class DecodeContext:
    """What a column decoder may need beyond the bytes: the seed and epoch that draws depend on, and,
    with ``skip`` (``on_error="skip"``), where it notes the samples it could not decode."""

    seed: int = 0
    epoch: int = 0
    skip: bool = False
    failed: list[tuple[int, str]] = field(default_factory=list)
    """``(position in the column, one-line error)`` of each sample a decoder could not decode."""


class ColumnDecoder(ABC):
    """Decodes one field of a whole batch: ``(column, keys, context) -> a tensor with the batch first,
    or a list with one value per sample``. Subclass it (or wrap a function with :func:`column_decoder`)
    to keep ``make_loader``'s batch path."""

    @abstractmethod
    def __call__(self, column: RaggedBytes, keys: Sequence[str], context: DecodeContext) -> Any: ...

    @property
    def finishes(self) -> bool:
        """Whether the loader must call :meth:`finish` on this field in the trainer process."""
        return False

    def finish(self, value: Any, context: DecodeContext) -> Any:
        """In the trainer process, once the batch has crossed from its worker: the field's final value
        (a device crop decodes there); what ``__call__`` returned, by default."""
        return value


def decode_cls(data: bytes) -> int:
    return int(data)


def decode_text(data: bytes) -> str:
    return data.decode("utf-8")


def decode_json(data: bytes) -> Any:
    return json.loads(data)


def decode_npy(data: bytes) -> torch.Tensor:
    return torch.from_numpy(np.load(io.BytesIO(data), allow_pickle=False))


def decode_pth(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


def decode_image(data: bytes) -> torch.Tensor:
    """Pillow decode to a uint8 tensor (C, H, W); needs the ``image`` extra (pip install shardpipe[image])."""
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("image decoding needs Pillow: pip install 'shardpipe[image]'") from exc
    with Image.open(io.BytesIO(data)) as image:
        array = np.asarray(image)
    array = array[:, :, None] if array.ndim == 2 else array  # (H, W) -> (H, W, 1)
    return torch.from_numpy(array.transpose(2, 0, 1).copy())  # (C, H, W); a writable copy of Pillow's buffer


def int_column(column: RaggedBytes) -> torch.Tensor:
    """Decimal integers, one per item, as one int64 tensor: items of one width (a label column's usual
    shape) are parsed as one array of digits, others one by one."""
    count, start = len(column), int(column.offsets[0])
    total = int(column.offsets[-1]) - start
    width = total // count if count else 0
    if 0 < width <= 18 and width * count == total:
        digits = np.frombuffer(column.buffer, np.uint8, total, start) - 48  # "0" is 48; below it wraps past 9
        if digits.max() <= 9 and (width == 1 or (np.diff(column.offsets) == width).all()):
            digits = digits.reshape(count, width).astype(np.int64)
            values = (
                digits[:, 0] if width == 1 else digits @ (10 ** np.arange(width - 1, -1, -1, dtype=np.int64))
            )
            return torch.from_numpy(values)
    return torch.tensor([int(item) for item in column], dtype=torch.int64)


def stacked(values: list[Any]) -> Any:
    """Tensors of one shape as one tensor with the batch first; anything else as the list."""
    first = values[0] if values else None
    if isinstance(first, torch.Tensor) and all(
        isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype for v in values
    ):
        return torch.stack(values)
    return values


@dataclass(frozen=True, slots=True)
class FieldDecoder:
    """How one field is decoded, on either path (see the module docstring)."""

    sample: Decoder | None
    column: ColumnDecoder
    batched: bool = True
    """Whether the batch path may take it: a per-sample callable of the user's keeps the per-sample path."""

    def __call__(self, data: bytes, key: str = "", context: DecodeContext | None = None) -> Any:
        """The per-sample path: one sample's value (a column decoder run on a column of one)."""
        if self.sample is not None:
            return self.sample(data)
        return self.column(RaggedBytes.from_list([data]), [key], context or DecodeContext())[0]


@dataclass(frozen=True)
class _Each(ColumnDecoder):
    """The column form of a per-sample decoder: each item decoded, the results stacked if they can be."""

    decoder: Decoder
    stack: bool = True

    def __call__(self, column: RaggedBytes, keys: Sequence[str], context: DecodeContext) -> Any:
        values = [self.decoder(item) for item in column]
        return stacked(values) if self.stack else values


@dataclass(frozen=True)
class _Function(ColumnDecoder):
    function: Callable[[RaggedBytes], Any]

    def __call__(self, column: RaggedBytes, keys: Sequence[str], context: DecodeContext) -> Any:
        return self.function(column)


def column_decoder(function: Callable[[RaggedBytes], Any]) -> ColumnDecoder:
    """A decoder of your own that takes a whole batch column (``RaggedBytes``) and returns the batch's
    values (a tensor with the batch first, or a list): it keeps ``make_loader``'s batch path. Module-level
    functions only, if the loader has workers (it is pickled to them)."""
    return _Function(function)


_INTS = FieldDecoder(decode_cls, _Function(int_column))
_IMAGE = FieldDecoder(decode_image, _Each(decode_image))
BUILTIN: dict[str, FieldDecoder] = {
    "cls": _INTS,
    "cls2": _INTS,
    "index": _INTS,
    "txt": FieldDecoder(decode_text, _Each(decode_text, stack=False)),
    "text": FieldDecoder(decode_text, _Each(decode_text, stack=False)),
    "json": FieldDecoder(decode_json, _Each(decode_json, stack=False)),
    "npy": FieldDecoder(decode_npy, _Each(decode_npy)),
    "pth": FieldDecoder(decode_pth, _Each(decode_pth, stack=False)),
    **dict.fromkeys(["jpg", "jpeg", "png", "bmp", "gif", "webp", "ppm", "pgm", "tif", "tiff"], _IMAGE),
}


def resolve_decoders(
    decode: str | Mapping[str, str | Decoder | ColumnDecoder] | None,
    fields: tuple[str, ...],
    label_fields: tuple[str, ...] = (),
) -> dict[str, FieldDecoder]:
    """Map each field to be decoded to its decoder; fields left out stay raw bytes. ``"auto"`` picks by
    extension, and decodes ``label_fields`` (class indexes, as the manifest records them) as ``cls``."""
    if decode is None:
        return {}
    if decode == "auto":
        kinds = {f: "cls" if f in label_fields else f.rsplit(".", 1)[-1].lower() for f in fields}
        return {f: BUILTIN[kind] for f, kind in kinds.items() if kind in BUILTIN}
    if isinstance(decode, str):
        raise ValueError(f"decode must be None, 'auto' or a mapping of field -> decoder, got {decode!r}")
    decoders: dict[str, FieldDecoder] = {}
    for name, decoder in decode.items():
        if name not in fields:
            raise ValueError(f"decode names field {name!r}, but the dataset's fields are {', '.join(fields)}")
        if isinstance(decoder, str):
            if decoder not in BUILTIN:
                raise ValueError(
                    f"unknown decoder {decoder!r} for {name!r}; built in: {', '.join(sorted(BUILTIN))}"
                )
            decoders[name] = BUILTIN[decoder]
        elif isinstance(decoder, FieldDecoder):
            decoders[name] = decoder
        elif isinstance(decoder, ColumnDecoder):
            decoders[name] = FieldDecoder(None, decoder)
        else:  # a per-sample callable of the user's: it keeps the per-sample path
            decoders[name] = FieldDecoder(decoder, _Each(decoder, stack=False), batched=False)
    return decoders


def decode_sample(
    sample: dict[str, Any], decoders: Mapping[str, FieldDecoder], context: DecodeContext, shard: str
) -> bool:
    """Decode ``sample``'s fields in place (the per-sample path); return whether a decoder skipped it
    (``on_error="skip"``: then it is flagged as a pad, as a read error's replacement is)."""
    skipped = False
    for name, decoder in decoders.items():
        if name in sample:
            context.failed.clear()
            try:
                sample[name] = decoder(sample[name], sample["__key__"], context)
            except DecodeError as exc:
                raise DecodeError.at(name, sample["__key__"], shard, exc.detail) from exc
            if context.failed:
                sample["__pad__"] = skipped = True
    return skipped
