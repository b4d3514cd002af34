"""Images decoded and cropped into model-ready batches: the crop drawn before decoding, fewer pixels decoded.

``decode={"jpg": RandomResizedCrop(224)}`` (training) or ``decode={"jpg": CenterCrop(224)}`` (evaluation)
turns a batch's image field into one ``uint8`` tensor ``(B, 3, size, size)``, decoded on the batch path
(no dict per sample). Per image:

1. the header is read (size, EXIF orientation), never the pixels;
2. the crop box is drawn on the image as displayed: torchvision's ``RandomResizedCrop`` algorithm and
   defaults (area in ``scale``, log-uniform aspect ratio in ``ratio``, ten tries, then a centre crop of
   the nearest allowed ratio), or, for evaluation, the centre ``size`` square of the image resized so its
   shorter side is ``resize``; the box is mapped back onto the pixels as stored;
3. a route is chosen from the header and the box (:func:`~.routes.choose_route`; see
   docs/design.md, "Images"): nvImageCodec decodes only the box's region of a JPEG (the batch's regions in
   one call), or Pillow decodes the whole image at the smallest DCT scale that keeps the box at least
   ``size`` pixels on each side (any format; the only route when nvImageCodec is not installed);
4. the box is cut and resized to ``size`` x ``size`` with an antialiased bilinear filter (torch's on a box
   of whole pixels, as torchvision crops then resizes; Pillow's sub-pixel ``resize(box=)`` on a box that a
   DCT scale leaves fractional), then turned upright by the EXIF orientation and, in training, flipped
   with probability 1/2.

The draws (box, flip) come from ``SeedSequence`` over (seed, epoch, a hash of the key) before any route is
chosen: the same crops for the same epoch on any run, rank, worker count or install, so a resumed epoch
gets the crops it would have had. With ``device=`` the workers stop after step 2 and the trainer process
decodes and crops the batch on that device (:mod:`.device_crops`). An image that cannot be decoded raises
:class:`~loaders.reading.decode.DecodeError` naming it, or, with ``on_error="skip"``, becomes a black
image whose sample is flagged as a pad and counted. Normalisation and the float conversion belong on the
GPU, after the uint8 copy (the README shows the two lines).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn.functional import interpolate

from loaders.images import device_crops, nvimgcodec
from loaders.images.boxes import (
    QUARTER_TURNS,
    Box,
    crop_draws,
    exif_orientation,
    resized_crop_box,
    stored_box,
    upright,
)
from loaders.images.routes import (
    Choice,
    Route,
    choose_route,
    is_complete_jpeg,
    region_capable,
    region_of,
    whole_box,
)
from loaders.reading.decode import ColumnDecoder, DecodeContext, DecodeError
from loaders.transfer.collate import RaggedBytes

__all__ = ["CenterCrop", "RandomResizedCrop", "crop_draws", "resized_crop_box"]
_CPU = torch.device("cpu")


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("image decoding needs Pillow: pip install 'shardpipe[image]'") from exc
    return Image


@dataclass(frozen=True, slots=True)
class _Plan:
    """One image's crop, drawn from its header: the box on the stored pixels, and how to decode it."""

    box: Box
    orientation: int
    flip: bool
    size: tuple[int, int]  # stored (width, height)
    choice: Choice


class _Crop(ColumnDecoder):
    """What both crops share: decoding a column into one reused batch tensor, per image as above."""

    size: int
    device: str | None

    def box(self, width: int, height: int, rng: np.random.Generator) -> tuple[Box, bool]:
        """The crop box on the displayed image, and whether to flip."""
        raise NotImplementedError

    @property
    def finishes(self) -> bool:
        """Whether the loader calls :meth:`finish` in the trainer: a device crop."""
        return self.device is not None

    @property
    def output_bytes(self) -> int:
        """Bytes of one decoded sample: what a batch carries to the trainer (sizes the transfer ring)."""
        return device_crops.HEADER_BYTES if self.device is not None else 3 * self.size * self.size

    def __call__(self, column: RaggedBytes, keys: Sequence[str], context: DecodeContext) -> Any:
        if self.device is not None:
            return self._encoded(column, keys, context)
        out = np.zeros((len(column), 3, self.size, self.size), dtype=np.uint8)  # (B, C, H, W)
        regions: list[tuple[int, bytes, _Plan]] = []  # decoded together, after the others
        region_decoder = nvimgcodec.available()
        for index, data in enumerate(column):
            try:
                with _pillow().open(io.BytesIO(data)) as image:
                    plan = self.plan(image, crop_draws(context.seed, context.epoch, keys[index]), data,
                                     region_decoder=region_decoder)  # fmt: skip
                    if plan.choice.route is Route.REGION:
                        regions.append((index, data, plan))
                    else:
                        out[index] = self._scaled(image, plan)
            except Exception as exc:  # Pillow raises many types for bad bytes: all are this image's
                _failed(context, index, exc)  # left black, flagged as a pad by the caller
        boxes = [region_of(plan.box, *plan.size) for _, _, plan in regions]
        for group in nvimgcodec.groups(boxes):  # bounded memory: large photos' regions a few at a time
            datas = [regions[g][1] for g in group]
            decoded = nvimgcodec.decode_regions(datas, [boxes[g] for g in group], _CPU)
            for g, image in zip(group, decoded, strict=True):
                index, data, plan = regions[g]
                try:
                    out[index] = (
                        self._region(image, plan) if image is not None else self._fallback(data, plan)
                    )
                except Exception as exc:
                    _failed(context, index, exc)
        return torch.from_numpy(out)

    def plan(self, image: Any, rng: np.random.Generator, data: bytes, *, region_decoder: bool) -> _Plan:
        """The draws for an open image (header only), and its route."""
        width, height = image.size
        orientation = exif_orientation(image.info.get("exif", b"")) if "exif" in image.info else 1
        shown = (height, width) if orientation in QUARTER_TURNS else (width, height)
        box, flip = self.box(*shown, rng)
        box = stored_box(box, orientation, *shown)
        complete = image.format != "JPEG" or is_complete_jpeg(data)
        choice = choose_route(
            image.format, image.mode, (width, height), box, self.size,
            complete=complete, region_decoder=region_decoder,
        )  # fmt: skip
        return _Plan(box, orientation, flip, (width, height), choice)

    def finish(self, value: Any, context: DecodeContext) -> torch.Tensor:
        """In the trainer process: a device crop's column (encoded bytes and draws) decoded and cropped on
        the device (:mod:`.device_crops`)."""
        if self.device is None:
            return value  # type: ignore[no-any-return]
        return device_crops.finish(value, self.size, torch.device(self.device), context)

    def _encoded(self, column: RaggedBytes, keys: Sequence[str], context: DecodeContext) -> RaggedBytes:
        """The device route's worker side: each image's draws, read from its header, before its bytes."""
        items = []
        for index, data in enumerate(column):
            try:
                with _pillow().open(io.BytesIO(data)) as image:
                    plan = self.plan(image, crop_draws(context.seed, context.epoch, keys[index]), data,
                                     region_decoder=True)  # fmt: skip
                    # A device has no DCT-scaled decode to weigh: nvImageCodec takes every plain JPEG.
                    capable = region_capable(image.format, image.mode, complete=is_complete_jpeg(data))
                route = device_crops.REGION if capable else device_crops.PILLOW
                items.append(device_crops.encode(data, plan.box, plan.orientation, plan.flip, route))
            except Exception as exc:
                _failed(context, index, exc)
                items.append(device_crops.blank())
        return RaggedBytes.from_list(items)

    def _scaled(self, image: Any, plan: _Plan) -> np.ndarray:
        """Pillow's route: the whole image at the plan's DCT scale, then the box."""
        image_module = _pillow()
        width, height = plan.size
        scale = 1
        wanted = plan.choice.scale
        if wanted > 1 and image.draft("RGB", (max(1, width // wanted), max(1, height // wanted))) is not None:
            scale = round(width / image.size[0])  # read back: never assume a scale was applied
        if image.mode != "RGB":
            image = image.convert("RGB")  # palettes, grey, CMYK, alpha: RGB before any resampling
        left, top, right, bottom = (coordinate / scale for coordinate in plan.box)
        if all(c.is_integer() for c in (left, top, right, bottom)):  # whole pixels: torch's faster resize
            pixels = self._resize(np.array(image.crop((int(left), int(top), int(right), int(bottom)))))
        else:  # a fraction of a pixel matters (integer boxes lose about 7 dB): Pillow's sub-pixel box
            box = (left, top, right, bottom)
            crop = image.resize((self.size, self.size), image_module.Resampling.BILINEAR, box=box)
            pixels = np.asarray(crop).transpose(2, 0, 1)
        return upright(pixels, plan.orientation, plan.flip)

    def _region(self, image: Any, plan: _Plan) -> np.ndarray:
        """nvImageCodec's route: the decoded region, the box cut to whole pixels, resized."""
        top, left, bottom, right = whole_box(plan.box, region_of(plan.box, *plan.size))
        pixels = nvimgcodec.as_tensor(image, _CPU).numpy()[top:bottom, left:right]
        return upright(self._resize(pixels), plan.orientation, plan.flip)

    def _fallback(self, data: bytes, plan: _Plan) -> np.ndarray:
        """An image the region decoder refused: Pillow's route decodes it, or says what is wrong."""
        with _pillow().open(io.BytesIO(data)) as image:
            return self._scaled(image, plan)

    def _resize(self, pixels: np.ndarray) -> np.ndarray:
        """``(h, w, 3)`` to ``(3, size, size)`` (a view): torch's antialiased bilinear resize, torchvision's
        crop-then-resize, the fastest of torch, OpenCV and Pillow whose output passed the quality bar
        (docs/design.md, "Images")."""
        channels_last = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)
        resized = interpolate(channels_last, size=(self.size, self.size), mode="bilinear", antialias=True)
        return resized[0].numpy()


def _failed(context: DecodeContext, index: int, exc: Exception) -> None:
    """Image ``index`` could not be decoded: a DecodeError, or, skipping, noted (left black)."""
    detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    if not context.skip:
        raise DecodeError(detail, index=index, detail=detail) from exc
    context.failed.append((index, detail))


@dataclass(frozen=True)
class RandomResizedCrop(_Crop):
    """Training: torchvision's random-resized-crop and horizontal flip, to ``size`` x ``size``."""

    size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    device: str | None = None
    """None: decoded in the workers; ``"cuda"``, ``"cuda:N"`` or ``"cpu"``: in the trainer, on it."""

    def __post_init__(self) -> None:
        _check(self.size, self.device)
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
    device: str | None = None
    """None: decoded in the workers; ``"cuda"``, ``"cuda:N"`` or ``"cpu"``: in the trainer, on it."""

    def __post_init__(self) -> None:
        _check(self.size, self.device)
        if self.resize is not None and self.resize < self.size:
            raise ValueError(f"resize {self.resize} must be at least size {self.size}")

    def box(self, width: int, height: int, rng: np.random.Generator) -> tuple[Box, bool]:
        shorter = self.resize if self.resize is not None else round(self.size * 256 / 224)
        side = self.size * min(width, height) / shorter  # the crop, in the image's own pixels
        left, top = (width - side) / 2, (height - side) / 2
        return (left, top, left + side, top + side), False


def _check(size: int, device: str | None) -> None:
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a whole number of pixels >= 1, got {size!r}")
    if device is not None:
        kind = torch.device(device).type  # a RuntimeError names a device string torch does not know
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"device must be None, 'cpu' or 'cuda[:N]', got {device!r}")
        nvimgcodec.require()
