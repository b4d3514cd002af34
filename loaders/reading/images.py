"""Images decoded and cropped into model-ready batches: the crop drawn before decoding, fewer pixels decoded.

``decode={"jpg": RandomResizedCrop(224)}`` (training) or ``decode={"jpg": CenterCrop(224)}`` (evaluation)
turns a batch's image field into one ``uint8`` tensor ``(B, 3, size, size)``, decoded on the batch path
(no dict per sample). Per image, decoded by Pillow (measured against simplejpeg, PyTurboJPEG and OpenCV,
docs/design-record.md: they were no faster where the output was as good):

1. the header is read (size, EXIF orientation), never the pixels;
2. the crop box is drawn on the image as displayed: torchvision's ``RandomResizedCrop`` algorithm and
   defaults (area in ``scale``, log-uniform aspect ratio in ``ratio``, ten tries, then a centre crop of
   the nearest allowed ratio), or, for evaluation, the centre ``size`` square of the image resized so its
   shorter side is ``resize``; the box is mapped back onto the pixels as stored;
3. a JPEG is decoded at the smallest DCT scale (1/2, 1/4, 1/8: Pillow's ``draft``) that keeps the box at
   least ``size`` pixels on each side, so a small crop of a large photo decodes a fraction of its pixels;
4. the box is cut and resized to ``size`` x ``size`` with an antialiased bilinear filter (torch's on a box
   of whole pixels, as torchvision crops then resizes; Pillow's sub-pixel ``resize(box=)`` on a box that a
   DCT scale or the evaluation crop leaves fractional), then turned upright by the EXIF orientation and,
   in training, flipped with probability 1/2.

The draws (box, flip) come from ``SeedSequence`` over (seed, epoch, a hash of the key): the same crops for
the same epoch on any run, rank or worker count, so a resumed epoch gets the crops it would have had.
Other images (PNG, WebP, grey or CMYK JPEGs, palettes) take the same steps without the DCT scale. An image
that cannot be decoded raises :class:`~loaders.reading.decode.DecodeError` naming it, or, with
``on_error="skip"``, becomes a black image whose sample is flagged as a pad and counted. Normalisation and
the float conversion belong on the GPU, after the uint8 copy (the README shows the two lines).
"""

from __future__ import annotations

import hashlib
import io
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn.functional import interpolate

from loaders.reading.decode import ColumnDecoder, DecodeContext, DecodeError
from loaders.transfer.collate import RaggedBytes

Box = tuple[float, float, float, float]
"""``(left, top, right, bottom)`` in pixels, as Pillow's ``resize(box=)`` takes it."""
_SCALES = (8, 4, 2, 1)
_QUARTER_TURNS = frozenset({5, 6, 7, 8})  # EXIF orientations that swap width and height


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("image decoding needs Pillow: pip install 'shardpipe[image]'") from exc
    return Image


class _Crop(ColumnDecoder):
    """What both crops share: decoding a column into one reused batch tensor, per image as above."""

    size: int

    def box(self, width: int, height: int, rng: np.random.Generator) -> tuple[Box, bool]:
        """The crop box on the displayed image, and whether to flip."""
        raise NotImplementedError

    @property
    def output_bytes(self) -> int:
        """Bytes of one decoded sample: what a batch carries to the trainer (sizes the transfer ring)."""
        return 3 * self.size * self.size

    def __call__(self, column: RaggedBytes, keys: Sequence[str], context: DecodeContext) -> torch.Tensor:
        out = np.zeros((len(column), 3, self.size, self.size), dtype=np.uint8)  # (B, C, H, W)
        for index, data in enumerate(column):
            rng = crop_draws(context.seed, context.epoch, keys[index])
            try:
                out[index] = self.decode(data, rng)
            except Exception as exc:  # Pillow raises many types for bad bytes: all are this image's
                detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                if not context.skip:
                    raise DecodeError(detail, index=index, detail=detail) from exc
                context.failed.append((index, detail))  # left black, flagged as a pad by the caller
        return torch.from_numpy(out)

    def decode(self, data: bytes, rng: np.random.Generator) -> np.ndarray:
        """One image's crop, ``(3, size, size)`` uint8 RGB (a view; the caller copies it into the batch)."""
        image_module = _pillow()
        with image_module.open(io.BytesIO(data)) as image:
            width, height = image.size
            orientation = exif_orientation(image.info.get("exif", b"")) if "exif" in image.info else 1
            shown = (height, width) if orientation in _QUARTER_TURNS else (width, height)
            box, flip = self.box(*shown, rng)
            box = stored_box(box, orientation, *shown)
            scale = 1
            if image.format == "JPEG":
                wanted = dct_scale(box, self.size)
                drafted = (
                    image.draft("RGB", (max(1, width // wanted), max(1, height // wanted)))
                    if wanted > 1
                    else None
                )
                if drafted is not None:  # None: no scale was applied (never assume one was)
                    scale = round(width / image.size[0])
            if image.mode != "RGB":
                image = image.convert("RGB")  # palettes, grey, CMYK, alpha: RGB before any resampling
            left, top, right, bottom = (coordinate / scale for coordinate in box)
            if all(c.is_integer() for c in (left, top, right, bottom)):  # whole pixels: torch's faster resize
                pixels = self._resize(np.array(image.crop((int(left), int(top), int(right), int(bottom)))))
            else:  # a fraction of a pixel matters (integer boxes lose about 7 dB): Pillow's sub-pixel box
                box = (left, top, right, bottom)
                crop = image.resize((self.size, self.size), image_module.Resampling.BILINEAR, box=box)
                pixels = np.asarray(crop).transpose(2, 0, 1)
        return _upright(pixels, orientation, flip)

    def _resize(self, pixels: np.ndarray) -> np.ndarray:
        """``(h, w, 3)`` to ``(3, size, size)`` (a view): torch's antialiased bilinear resize, torchvision's
        crop-then-resize, which on uint8 channels-last input is faster than Pillow's
        (docs/design-record.md)."""
        channels_last = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)
        resized = interpolate(channels_last, size=(self.size, self.size), mode="bilinear", antialias=True)
        return resized[0].numpy()


@dataclass(frozen=True)
class RandomResizedCrop(_Crop):
    """Training: torchvision's random-resized-crop and horizontal flip, to ``size`` x ``size``."""

    size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True

    def __post_init__(self) -> None:
        _check(self.size)
        if not 0 < self.scale[0] <= self.scale[1] <= 1 or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(
                f"scale {self.scale} and ratio {self.ratio} must be increasing pairs in (0, 1], > 0"
            )

    def box(self, width: int, height: int, rng: np.random.Generator) -> tuple[Box, bool]:
        left, top, w, h = resized_crop_box(width, height, rng, self.scale, self.ratio)
        flip = bool(rng.random() < 0.5) if self.flip else False
        return (float(left), float(top), float(left + w), float(top + h)), flip


@dataclass(frozen=True)
class CenterCrop(_Crop):
    """Evaluation: resize the shorter side to ``resize`` (default ``size * 256 / 224``), crop the centre."""

    size: int = 224
    resize: int | None = None

    def __post_init__(self) -> None:
        _check(self.size)
        if self.resize is not None and self.resize < self.size:
            raise ValueError(f"resize {self.resize} must be at least size {self.size}")

    def box(self, width: int, height: int, rng: np.random.Generator) -> tuple[Box, bool]:
        shorter = self.resize if self.resize is not None else round(self.size * 256 / 224)
        side = self.size * min(width, height) / shorter  # the crop, in the image's own pixels
        left, top = (width - side) / 2, (height - side) / 2
        return (left, top, left + side, top + side), False


def resized_crop_box(
    width: int, height: int, rng: np.random.Generator, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    """``(left, top, w, h)`` by torchvision's ``RandomResizedCrop.get_params`` algorithm: ten draws of an
    area fraction (uniform in ``scale``) and an aspect ratio (log-uniform in ``ratio``), the first that fits
    placed uniformly; else a centre crop of the whole image clamped to the allowed ratios."""
    area = width * height
    low, high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(low, high))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, w, h
    if width / height < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif width / height > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def dct_scale(box: Box, size: int) -> int:
    """The largest of 8, 4, 2, 1 that keeps ``box``, decoded that many times smaller, at least ``size``
    pixels on each side."""
    shorter = min(box[2] - box[0], box[3] - box[1])
    return next(scale for scale in _SCALES if scale == 1 or scale * size <= shorter)


def stored_box(box: Box, orientation: int, width: int, height: int) -> Box:
    """``box`` on the displayed image (``width`` x ``height``) as a box on the pixels as stored."""
    if orientation == 1:
        return box
    a = _stored_point(orientation, box[0], box[1], width, height)
    b = _stored_point(orientation, box[2], box[3], width, height)
    return min(a[0], b[0]), min(a[1], b[1]), max(a[0], b[0]), max(a[1], b[1])


def _stored_point(orientation: int, x: float, y: float, width: int, height: int) -> tuple[float, float]:
    """The stored position of displayed point ``(x, y)``, by the inverse of the EXIF transform."""
    return {
        2: (width - x, y),
        3: (width - x, height - y),
        4: (x, height - y),
        5: (y, x),
        6: (y, width - x),
        7: (height - y, width - x),
        8: (height - y, x),
    }[orientation]


def exif_orientation(exif: bytes) -> int:
    """The Orientation tag (1-8) of a raw EXIF block (``Exif\\0\\0`` and a TIFF header), else 1."""
    tiff = exif[6:] if exif.startswith(b"Exif\x00\x00") else exif
    if len(tiff) < 8 or tiff[:2] not in (b"II", b"MM"):
        return 1
    order = "<" if tiff[:2] == b"II" else ">"
    (first,) = struct.unpack_from(order + "I", tiff, 4)
    if first + 2 > len(tiff):
        return 1
    (count,) = struct.unpack_from(order + "H", tiff, first)
    for entry in range(first + 2, min(first + 2 + 12 * count, len(tiff) - 11), 12):
        tag, _, _, value = struct.unpack_from(order + "HHIH", tiff, entry)
        if tag == 0x0112:
            return value if 1 <= value <= 8 else 1
    return 1


def crop_draws(seed: int, epoch: int, key: str) -> np.random.Generator:
    """The random numbers of one image's crop: a function of (seed, epoch, key) only."""
    digest = hashlib.blake2b(key.encode(), digest_size=16, person=b"shardpipe-crop").digest()
    return np.random.default_rng(np.random.SeedSequence([seed, epoch, int.from_bytes(digest, "big")]))


def _check(size: int) -> None:
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a whole number of pixels >= 1, got {size!r}")


def _upright(pixels: np.ndarray, orientation: int, flip: bool) -> np.ndarray:
    """``(3, h, w)`` stored pixels turned upright by the EXIF orientation (Pillow's ``exif_transpose``
    table), then mirrored if ``flip``: views, no copy."""
    if orientation in _QUARTER_TURNS:
        pixels = pixels.transpose(0, 2, 1)  # 5 is the transpose alone; 6, 7, 8 add flips
    flip_rows = orientation in (3, 4, 7, 8)
    flip_columns = (orientation in (2, 3, 6, 7)) != flip
    return pixels[:, :: -1 if flip_rows else 1, :: -1 if flip_columns else 1]
