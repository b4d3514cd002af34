"""Crops finished on a device: the workers draw, the trainer process decodes, crops, resizes and flips.

With ``RandomResizedCrop(224, device="cuda")`` a worker reads each image's header, draws its box and flip
(the same draws as the worker-side crops) and ships the encoded bytes with them: item i of the batch's
column is :data:`HEADER_BYTES` of parameters (the box on the stored pixels, the EXIF orientation, the
flip, the route) followed by the image's bytes, so a batch crosses processes as one buffer, as raw bytes
do. In the trainer process the loader calls the crop's ``finish`` on that column (:func:`finish`): one
batched nvImageCodec decode of every box's region on the device (nvJPEG and the hardware JPEG engine on
a GPU, libjpeg-turbo on ``device="cpu"``: the same code, only the device differs), then per image the
box cut to whole pixels, an antialiased bilinear resize, the EXIF turn and the flip in torch, into one
``uint8 (B, 3, size, size)`` tensor on the device. An image nvImageCodec cannot decode (or one the
worker routed to Pillow: not a plain complete RGB or grey JPEG) is decoded by Pillow on the CPU and
moved; one Pillow cannot decode either is a :class:`DecodeError`, or a black image noted as failed.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
from torch.nn.functional import interpolate

from loaders.images import nvimgcodec
from loaders.images.boxes import QUARTER_TURNS, Box
from loaders.images.routes import region_of, whole_box
from loaders.reading.decode import DecodeContext, DecodeError
from loaders.transfer.collate import RaggedBytes

_FIELDS = 8  # left, top, right, bottom, orientation, flip, route, spare: float64 each
HEADER_BYTES = 8 * _FIELDS
PILLOW, REGION, BLANK = 0.0, 1.0, 2.0  # the route field: Pillow on the CPU, nvImageCodec, none (skipped)


def encode(data: bytes, box: Box, orientation: int, flip: bool, route: float) -> bytes:
    """One item of a device crop's column: the parameters, then the encoded image."""
    header = np.array([*box, orientation, float(flip), route, 0.0], dtype=np.float64)
    return header.tobytes() + data


def blank() -> bytes:
    """The item of a sample the worker could not read (skipped): left black by :func:`finish`."""
    return encode(b"", (0.0, 0.0, 1.0, 1.0), 1, False, BLANK)


def finish(column: RaggedBytes, size: int, device: torch.device, context: DecodeContext) -> torch.Tensor:
    """The column's crops as ``uint8 (B, 3, size, size)`` on ``device`` (see the module docstring)."""
    count = len(column)
    starts = column.offsets[:-1]
    view = memoryview(column.buffer)
    headers = (
        np.stack([np.frombuffer(column.buffer, np.float64, _FIELDS, int(s)) for s in starts])
        if count
        else np.zeros((0, _FIELDS))
    )  # (B, 8)
    datas = [view[int(s) + HEADER_BYTES : int(e)] for s, e in zip(starts, column.offsets[1:], strict=True)]
    out = torch.zeros((count, 3, size, size), dtype=torch.uint8, device=device)
    wanted = [i for i in range(count) if headers[i, 6] == REGION]
    regions = {i: _region(datas[i], headers[i]) for i in wanted}
    runs = [[wanted[g] for g in run] for run in nvimgcodec.groups([regions[i] for i in wanted])]
    others = [[i] for i in range(count) if headers[i, 6] == PILLOW]
    for group in [*runs, *others]:  # a group of regions decoded at once, or one image for Pillow
        decoded: list[Any] = [None] * len(group)
        if headers[group[0], 6] == REGION:
            decoded = nvimgcodec.decode_regions(
                [datas[i] for i in group], [regions[i] for i in group], device
            )
        for i, image in zip(group, decoded, strict=True):
            box = tuple(headers[i, :4].tolist())
            try:
                if image is not None:
                    pixels, region = nvimgcodec.as_tensor(image, device), regions[i]
                else:  # routed to Pillow, or refused by nvImageCodec: Pillow decodes it or says why not
                    pixels, region = _pillow(bytes(datas[i]), box, device)
                out[i] = _crop(pixels, whole_box(box, region), size, int(headers[i, 4]), bool(headers[i, 5]))
            except Exception as exc:  # Pillow raises many types for bad bytes: all are this image's
                detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                if not context.skip:
                    raise DecodeError(detail, index=i, detail=detail) from exc
                context.failed.append((i, detail))
    return out


def _region(data: memoryview, header: np.ndarray) -> tuple[int, int, int, int]:
    """The whole stored pixels around the header's box, inside the image (its size read by nvImageCodec)."""
    width, height = _size(data)
    left, top, right, bottom = header[:4].tolist()
    return region_of((left, top, right, bottom), width, height)


def _size(data: memoryview) -> tuple[int, int]:
    try:
        stream = nvimgcodec.require().CodeStream(data)
    except RuntimeError:
        return 1 << 30, 1 << 30  # unparsable: the region is clipped by the box alone; decoding will refuse
    return int(stream.width), int(stream.height)


def _pillow(data: bytes, box: Box, device: torch.device) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
    """The region around ``box`` decoded by Pillow as ``(h, w, 3)`` uint8 on ``device``, and the region."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        region = region_of(box, *image.size)
        top, left, bottom, right = region
        rgb = image.convert("RGB") if image.mode != "RGB" else image
        pixels = np.array(rgb.crop((left, top, right, bottom)))  # writable: torch shares it
    return torch.from_numpy(pixels).to(device), region


def _crop(
    pixels: torch.Tensor, box: tuple[int, int, int, int], size: int, orientation: int, flip: bool
) -> torch.Tensor:
    """``(h, w, 3)`` pixels -> the box resized to ``(3, size, size)`` uint8, turned upright, flipped."""
    top, left, bottom, right = box
    channels = pixels[top:bottom, left:right].permute(2, 0, 1).unsqueeze(0).float()  # (1, 3, h, w)
    resized = interpolate(channels, size=(size, size), mode="bilinear", antialias=True)[0]
    crop = resized.round_().clamp_(0, 255).to(torch.uint8)  # (3, size, size)
    if orientation in QUARTER_TURNS:
        crop = crop.transpose(1, 2)  # 5 is the transpose alone; 6, 7, 8 add flips (Pillow's table)
    dims = [
        d for d, on in ((1, orientation in (3, 4, 7, 8)), (2, (orientation in (2, 3, 6, 7)) != flip)) if on
    ]
    return crop.flip(dims) if dims else crop
