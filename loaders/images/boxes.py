"""The geometry and the draws of the image crops: boxes, DCT scales, EXIF orientations.

Pure functions, shared by the crops decoded in the workers (:mod:`.crops`) and those finished on a device
(:mod:`.device_crops`). The draws of one image come from ``SeedSequence`` over (seed, epoch, a hash of the
key) and are taken before any decoder is chosen, so the route an image takes never changes its crop.
"""

from __future__ import annotations

import hashlib
import math
import struct

import numpy as np

Box = tuple[float, float, float, float]
"""``(left, top, right, bottom)`` in pixels, as Pillow's ``resize(box=)`` takes it."""
QUARTER_TURNS = frozenset({5, 6, 7, 8})  # EXIF orientations that swap width and height
_SCALES = (8, 4, 2, 1)


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


def upright(pixels: np.ndarray, orientation: int, flip: bool) -> np.ndarray:
    """``(3, h, w)`` stored pixels turned upright by the EXIF orientation (Pillow's ``exif_transpose``
    table), then mirrored if ``flip``: views, no copy."""
    if orientation in QUARTER_TURNS:
        pixels = pixels.transpose(0, 2, 1)  # 5 is the transpose alone; 6, 7, 8 add flips
    flip_rows = orientation in (3, 4, 7, 8)
    flip_columns = (orientation in (2, 3, 6, 7)) != flip
    return pixels[:, :: -1 if flip_rows else 1, :: -1 if flip_columns else 1]
