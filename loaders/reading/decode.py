"""Field decoders, chosen by the field's extension. Nothing is ever unpickled.

``decode=None`` keeps raw bytes (fastest; decode in ``transform`` or on the GPU). ``decode="auto"`` decodes
every field whose last extension is known; a mapping names a decoder (or a callable) per field.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

Decoder = Callable[[bytes], Any]


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


BUILTIN: dict[str, Decoder] = {
    "cls": decode_cls,
    "cls2": decode_cls,
    "index": decode_cls,
    "txt": decode_text,
    "text": decode_text,
    "json": decode_json,
    "npy": decode_npy,
    "pth": decode_pth,
    **dict.fromkeys(["jpg", "jpeg", "png", "bmp", "gif", "webp", "ppm", "pgm", "tif", "tiff"], decode_image),
}


def resolve_decoders(
    decode: str | Mapping[str, str | Decoder] | None, fields: tuple[str, ...]
) -> dict[str, Decoder]:
    """Map each field to be decoded to its decoder; fields left out stay raw bytes."""
    if decode is None:
        return {}
    if decode == "auto":
        return {
            f: BUILTIN[f.rsplit(".", 1)[-1].lower()]
            for f in fields
            if f.rsplit(".", 1)[-1].lower() in BUILTIN
        }
    if isinstance(decode, str):
        raise ValueError(f"decode must be None, 'auto' or a mapping of field -> decoder, got {decode!r}")
    decoders: dict[str, Decoder] = {}
    for field, decoder in decode.items():
        if field not in fields:
            raise ValueError(
                f"decode names field {field!r}, but the dataset's fields are {', '.join(fields)}"
            )
        if isinstance(decoder, str):
            if decoder not in BUILTIN:
                raise ValueError(
                    f"unknown decoder {decoder!r} for {field!r}; built in: {', '.join(sorted(BUILTIN))}"
                )
            decoders[field] = BUILTIN[decoder]
        else:
            decoders[field] = decoder
    return decoders
