"""Which decoder a crop takes, per image: a pure function of what the header says and the box drawn.

Two routes, measured against each other per image size and box (docs/design.md, "Images"):

- ``REGION``: nvImageCodec (libjpeg-turbo) decodes only the box's rows and columns, widened to the JPEG
  blocks it touches, at full resolution; rows below the box are never read and rows above are only
  entropy-decoded. The box is then cut to whole pixels and resized by torch.
- ``SCALED``: Pillow decodes the whole image at a DCT scale (1/2, 1/4, 1/8 with ``draft``) that keeps the
  box at least the output's size; ``scale == 1`` is Pillow's full decode, the route of every image that
  is not a plain complete RGB or grey JPEG (PNG, WebP, CMYK, one whose end marker is missing), and of
  every image when nvImageCodec is not installed.

No decoder measured offers both at once from Python (nvImageCodec keeps libjpeg-turbo's scale internal;
Pillow's ``draft`` decodes every row), so a large box of a large photo, which a DCT scale shrinks most,
stays on ``SCALED``: the limits below are where the two routes' times crossed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from loaders.images.boxes import Box, dct_scale

REGION_MAX_SCALE = 2
"""At DCT scale 1 or 2 the region decode was faster for every crop measured (docs/design.md, "Images")."""
REGION_MAX_SCALED_AREA = 8.0
"""Past scale 2: the region route while the box's share of the image times the scale squared stays at or
below this, where the two routes' times crossed on large photos (docs/design.md, "Images")."""
REGION_MODES = frozenset({"RGB", "L"})  # JPEG colour modes whose region decode matches Pillow's


class Route(Enum):
    REGION = "region"
    SCALED = "scaled"


@dataclass(frozen=True, slots=True)
class Choice:
    """A route and the DCT scale it decodes at (always 1 for ``REGION``)."""

    route: Route
    scale: int


def choose_route(
    format_name: str | None,
    mode: str,
    size: tuple[int, int],
    box: Box,
    output: int,
    *,
    complete: bool = True,
    region_decoder: bool = True,
) -> Choice:
    """The route of one image: its format and colour mode (Pillow's names), its stored ``size``
    ``(width, height)``, the crop ``box`` on the stored pixels and the ``output`` side; ``complete``:
    whether the data ends with the JPEG end marker (else Pillow decodes it, and names what is wrong);
    ``region_decoder``: whether nvImageCodec is installed here."""
    scale = dct_scale(box, output)
    if not (region_decoder and region_capable(format_name, mode, complete=complete)):
        return Choice(Route.SCALED, scale if format_name == "JPEG" else 1)
    width, height = size
    share = (box[2] - box[0]) * (box[3] - box[1]) / (width * height)
    if scale <= REGION_MAX_SCALE or share * scale * scale <= REGION_MAX_SCALED_AREA:
        return Choice(Route.REGION, 1)
    return Choice(Route.SCALED, scale)


def region_capable(format_name: str | None, mode: str, *, complete: bool) -> bool:
    """Whether nvImageCodec's region decode is trusted with the image: a complete RGB or grey JPEG."""
    return format_name == "JPEG" and mode in REGION_MODES and complete


def region_of(box: Box, width: int, height: int) -> tuple[int, int, int, int]:
    """``(top, left, bottom, right)``: the whole pixels that cover ``box``, inside the image."""
    left, top = max(0, math.floor(box[0])), max(0, math.floor(box[1]))
    right, bottom = min(width, math.ceil(box[2])), min(height, math.ceil(box[3]))
    return top, left, max(bottom, top + 1), max(right, left + 1)


def whole_box(box: Box, region: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """``box`` rounded to whole pixels, as ``(top, left, bottom, right)`` inside ``region``'s pixels."""
    top, left, bottom, right = region
    x0 = min(max(round(box[0]) - left, 0), right - left - 1)
    y0 = min(max(round(box[1]) - top, 0), bottom - top - 1)
    x1 = min(max(round(box[2]) - left, x0 + 1), right - left)
    y1 = min(max(round(box[3]) - top, y0 + 1), bottom - top)
    return y0, x0, y1, x1


def is_complete_jpeg(data: bytes | memoryview) -> bool:
    """Whether JPEG data ends with its end-of-image marker (trailing zero padding allowed)."""
    tail = bytes(data[-64:]).rstrip(b"\x00")
    return tail.endswith(b"\xff\xd9")
