"""Built-in image preparation at pack time: shrink to a longest side, re-encode at a quality.

Decoding a 256 px JPEG costs a fraction of a full-size one, every epoch, so the largest gain an image
pipeline gets is storing images no larger than training uses. For every field whose last extension names
an image (:data:`IMAGE_FIELDS`):

* an image whose longest side (as displayed, EXIF orientation applied) is at most ``max_side`` is kept
  byte for byte;
* a larger one is decoded (a JPEG at the smallest DCT scale that keeps at least twice the target size),
  turned upright by its EXIF orientation, resized with Lanczos (reduced by whole factors first, which is
  as good and faster), and encoded again in its own format: JPEG and WebP at ``quality``, PNG losslessly,
  without EXIF (the orientation is now in the pixels) and keeping an ICC profile.

The result depends only on the input bytes, the settings and Pillow's version (recorded in the job), so a
pack is byte-reproducible. Pillow is the ``image`` extra (``pip install 'shardpipe[image]'``; pillow-simd,
where it installs, is a user's choice).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from shardpipe.errors import UsageError

IMAGE_FIELDS = frozenset({"jpg", "jpeg", "png", "webp"})
"""Field extensions that hold images this preparation rewrites."""
DEFAULT_QUALITY = 90
_FORMATS = {"JPEG", "PNG", "WEBP"}


def _pillow() -> Any:
    try:
        import PIL
        from PIL import Image, ImageOps
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UsageError("image preparation needs Pillow: pip install 'shardpipe[image]'") from exc
    return PIL, Image, ImageOps


@dataclass(frozen=True, slots=True)
class ImagePreparation:
    """Shrink image fields to ``max_side`` pixels at most, re-encoded at ``quality`` (JPEG and WebP)."""

    max_side: int
    quality: int = DEFAULT_QUALITY

    def __post_init__(self) -> None:
        if not isinstance(self.max_side, int) or self.max_side < 1:
            raise UsageError(f"image max side must be a whole number of pixels >= 1, got {self.max_side!r}")
        if not isinstance(self.quality, int) or not 1 <= self.quality <= 100:
            raise UsageError(f"image quality must be 1-100, got {self.quality!r}")

    def identity(self) -> dict[str, Any]:
        """What shapes the output bytes: the settings and the Pillow that encodes them."""
        pil, _, _ = _pillow()
        return {"max_side": self.max_side, "quality": self.quality, "pillow": pil.__version__}

    def __call__(self, fields: dict[str, bytes]) -> dict[str, bytes]:
        return {
            name: self.prepare(data) if name.rsplit(".", 1)[-1].lower() in IMAGE_FIELDS else data
            for name, data in fields.items()
        }

    def prepare(self, data: bytes) -> bytes:
        """One image's bytes, shrunk and re-encoded, or as they are when small enough."""
        _, image_module, image_ops = _pillow()
        with image_module.open(io.BytesIO(data)) as image:
            if image.format not in _FORMATS:
                return data  # e.g. a GIF or TIFF under an image name: kept, not guessed at
            width, height = image.size
            turned = image.getexif().get(0x0112, 1) in (5, 6, 7, 8)  # EXIF orientation: a quarter turn
            longest = max(width, height)
            if longest <= self.max_side:
                return data
            scale = self.max_side / longest
            target = (max(1, round(width * scale)), max(1, round(height * scale)))  # stored orientation
            image.draft(image.mode, (target[0] * 2, target[1] * 2))  # JPEG: decode at a DCT scale
            icc = image.info.get("icc_profile")
            upright = image_ops.exif_transpose(image)
            if upright.mode == "P" or upright.mode == "PA":
                upright = upright.convert(
                    "RGBA" if "transparency" in upright.info or upright.mode == "PA" else "RGB"
                )
            size = (target[1], target[0]) if turned else target
            resized = upright.resize(size, image_module.Resampling.LANCZOS, reducing_gap=3.0)
            return _encode(resized, image.format, self.quality, icc)


def _encode(image: Any, fmt: str, quality: int, icc: bytes | None) -> bytes:
    out = io.BytesIO()
    options: dict[str, Any] = {"icc_profile": icc} if icc else {}
    if fmt == "JPEG":
        if image.mode not in ("L", "RGB", "CMYK"):
            image = image.convert("RGB")
        image.save(out, "JPEG", quality=quality, optimize=False, progressive=False, **options)
    elif fmt == "WEBP":
        image.save(out, "WEBP", quality=quality, method=4, **options)
    else:
        image.save(out, "PNG", optimize=False, **options)
    return out.getvalue()
