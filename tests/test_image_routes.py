"""The crops' decode routes: chosen by a pure function of the header and the box; every route within 30 dB
of a full-size decode with the same box and resize, on every image kind; the box never depends on the
route; Pillow alone when nvImageCodec cannot be imported; undecodable images named or skipped."""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from loaders import CenterCrop, RandomResizedCrop
from loaders.batches import RaggedBytes
from loaders.images import crops as images
from loaders.images import nvimgcodec
from loaders.images.boxes import crop_draws, dct_scale
from loaders.images.routes import (
    REGION_MAX_SCALE,
    REGION_MAX_SCALED_AREA,
    Choice,
    Route,
    choose_route,
    is_complete_jpeg,
    region_of,
    whole_box,
)
from loaders.reading.decode import DecodeContext, DecodeError
from testkit.photos import (
    as_cmyk,
    as_grey,
    as_png,
    as_progressive,
    exif_rotated,
    photo_bytes,
    truncated,
)
from tests.test_image_crops import decoded, psnr

PHOTOS = photo_bytes(3, size=(500, 375), seed=21) + photo_bytes(2, size=(2000, 1500), seed=22)
KEYS = [f"r/{i}" for i in range(len(PHOTOS))]
WIDTH, HEIGHT = 2000, 1500


def box_of(side: float, width: int = WIDTH) -> tuple[float, float, float, float]:
    return (0.0, 0.0, side, side)


def test_region_decode_where_the_dct_scale_is_small_or_the_box_a_small_share() -> None:
    def route(box: Any, **kwargs: Any) -> Choice:
        return choose_route("JPEG", "RGB", (WIDTH, HEIGHT), box, 224, **kwargs)

    small = box_of(300)  # no DCT scale keeps 224 pixels
    assert dct_scale(small, 224) == 1 and route(small) == Choice(Route.REGION, 1)
    at_limit = box_of(224 * REGION_MAX_SCALE)
    assert dct_scale(at_limit, 224) == REGION_MAX_SCALE and route(at_limit).route is Route.REGION
    scale = 2 * REGION_MAX_SCALE  # past the limit, the box's share of the image decides
    share_side = math.sqrt(REGION_MAX_SCALED_AREA / scale**2 * WIDTH * HEIGHT)
    below, above = box_of(share_side * 0.99), box_of(min(share_side * 1.01, HEIGHT))
    assert dct_scale(below, 224) == dct_scale(above, 224) == scale
    assert route(below) == Choice(Route.REGION, 1)
    assert route(above) == Choice(Route.SCALED, scale)
    for kwargs in ({"complete": False}, {"region_decoder": False}):  # Pillow, at the DCT scale
        assert route(small, **kwargs) == Choice(Route.SCALED, 1)
        assert route(above, **kwargs) == Choice(Route.SCALED, scale)
    for mode in ("CMYK", "P"):
        assert choose_route("JPEG", mode, (WIDTH, HEIGHT), above, 224) == Choice(Route.SCALED, scale)
    for fmt in ("PNG", "WEBP", None):  # no DCT scale outside JPEG
        assert choose_route(fmt, "RGB", (WIDTH, HEIGHT), above, 224) == Choice(Route.SCALED, 1)


def test_regions_cover_the_box_inside_the_image() -> None:
    rng = np.random.default_rng(0)
    for _ in range(500):
        width, height = (int(v) for v in rng.integers(1, 900, 2))
        x0, x1 = sorted(rng.uniform(0, width, 2))
        y0, y1 = sorted(rng.uniform(0, height, 2))
        box = (x0, y0, max(x1, x0 + 0.3), max(y1, y0 + 0.3))
        top, left, bottom, right = region = region_of(box, width, height)
        assert 0 <= left <= box[0] and 0 <= top <= box[1] and left < right <= width and top < bottom <= height
        assert right >= min(box[2], width) and bottom >= min(box[3], height)
        y0i, x0i, y1i, x1i = whole_box(box, region)
        assert 0 <= x0i < x1i <= right - left and 0 <= y0i < y1i <= bottom - top
        assert abs(left + x0i - box[0]) <= 1 and abs(top + y1i - min(box[3], height)) <= 1


def test_regions_are_decoded_in_groups_of_bounded_pixels(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    regions = [(0, 0, int(h), int(w)) for h, w in rng.integers(1, 300, (200, 2))]
    runs = list(nvimgcodec.groups(regions, 20_000))
    assert [i for run in runs for i in run] == list(range(200))
    for run in runs:
        pixels = sum((b - t) * (r - left) for t, left, b, r in (regions[i] for i in run))
        assert pixels <= 20_000 or len(run) == 1
    whole = RandomResizedCrop(64)(RaggedBytes.from_list(PHOTOS), KEYS, DecodeContext())
    monkeypatch.setattr(nvimgcodec, "GROUP_PIXELS", 1)  # one region per call: the same crops
    assert torch.equal(whole, RandomResizedCrop(64)(RaggedBytes.from_list(PHOTOS), KEYS, DecodeContext()))


def test_complete_jpegs_end_with_their_marker() -> None:
    assert is_complete_jpeg(PHOTOS[0]) and is_complete_jpeg(PHOTOS[0] + b"\x00" * 10)
    assert not is_complete_jpeg(truncated(PHOTOS[0]))


FORCED = {
    "region": lambda choice: Choice(Route.REGION, 1),
    "scaled": lambda choice: Choice(Route.SCALED, max(choice.scale, 1)),
    "full": lambda choice: Choice(Route.SCALED, 1),
    "chosen": lambda choice: choice,
}


def forced(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    chosen = images.choose_route
    monkeypatch.setattr(images, "choose_route", lambda *a, **k: FORCED[name](chosen(*a, **k)))


def reference(decoder: Any, data: bytes, key: str, size: int) -> np.ndarray:
    """The whole image decoded by Pillow, upright, the decoder's own box, Pillow's box resize, the flip."""
    image = decoded(data)
    box, flip = decoder.box(*image.size, crop_draws(3, 0, key))
    out = image.resize((size, size), Image.Resampling.BILINEAR, box=box)
    return np.asarray(out.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else out)


KINDS = {
    "jpeg": lambda data: data,
    "grey": as_grey,
    "cmyk": as_cmyk,
    "progressive": as_progressive,
    "exif-6": lambda data: exif_rotated(data, 6),
    "exif-3": lambda data: exif_rotated(data, 3),
    "png": as_png,
}


@pytest.mark.parametrize("route", FORCED)
def test_every_route_is_within_30_db_of_a_full_decode_on_every_kind(
    monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    forced(monkeypatch, route)
    for make_decoder in (RandomResizedCrop, CenterCrop):
        decoder = make_decoder(112)
        for kind, make in KINDS.items():
            datas = [make(data) for data in (PHOTOS[0], PHOTOS[3])]
            got = decoder(RaggedBytes.from_list(datas), KEYS[:2], DecodeContext(seed=3))
            for i, data in enumerate(datas):
                want = reference(decoder, data, KEYS[i], 112)
                assert psnr(got[i].permute(1, 2, 0).numpy(), want) >= 30, (route, kind, i, decoder)


def test_the_route_never_changes_the_box_and_routes_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    decoder = RandomResizedCrop(96)
    for data, key in zip(PHOTOS, KEYS, strict=True):
        with Image.open(io.BytesIO(data)) as image:
            plans = [
                decoder.plan(image, crop_draws(1, 2, key), data, region_decoder=r) for r in (True, False)
            ]
        assert (plans[0].box, plans[0].flip) == (plans[1].box, plans[1].flip)
    outputs = {}
    for name in ("region", "scaled"):
        forced(monkeypatch, name)
        outputs[name] = decoder(RaggedBytes.from_list(PHOTOS), KEYS, DecodeContext(seed=1, epoch=2))
        monkeypatch.undo()
    for a, b in zip(outputs["region"], outputs["scaled"], strict=True):
        assert psnr(a.numpy(), b.numpy()) >= 30


def without_nvimgcodec(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if ``import nvidia.nvimgcodec`` had failed in this process."""
    monkeypatch.setattr(nvimgcodec, "_state", {"module": None, "error": "ImportError: simulated"})


def test_without_nvimgcodec_pillow_decodes_every_image(monkeypatch: pytest.MonkeyPatch) -> None:
    forced(monkeypatch, "chosen")
    with_it = RandomResizedCrop(96)(RaggedBytes.from_list(PHOTOS), KEYS, DecodeContext(seed=4))
    monkeypatch.undo()
    without_nvimgcodec(monkeypatch)
    calls: list[Any] = []
    monkeypatch.setattr(nvimgcodec, "decode_regions", lambda *a: calls.append(a))
    assert not nvimgcodec.available()
    without = RandomResizedCrop(96)(RaggedBytes.from_list(PHOTOS), KEYS, DecodeContext(seed=4))
    assert calls == [] and without.shape == with_it.shape
    for a, b in zip(with_it, without, strict=True):
        assert psnr(a.numpy(), b.numpy()) >= 30
    with pytest.raises(ImportError, match=r"shardpipe\[nvimgcodec\].*simulated"):
        RandomResizedCrop(96, device="cpu")


@pytest.mark.parametrize("device", [None, "cpu"], ids=["workers", "device"])
def test_a_truncated_or_corrupt_image_is_named_or_skipped(device: str | None) -> None:
    datas = [PHOTOS[0], truncated(PHOTOS[1]), PHOTOS[2], b"\xff\xd8 not a jpeg"]
    column = RaggedBytes.from_list(datas)
    crop = RandomResizedCrop(64, device=device)

    def run(context: DecodeContext) -> torch.Tensor:
        value = crop(column, KEYS[:4], context)
        return crop.finish(value, context)

    for bad, words in ((1, "truncated"), (3, "UnidentifiedImageError")):
        column = RaggedBytes.from_list([data for i, data in enumerate(datas) if i in (0, bad)])
        with pytest.raises(DecodeError, match=words) as caught:
            run(DecodeContext())
        assert caught.value.index == 1
    column = RaggedBytes.from_list(datas)
    context = DecodeContext(skip=True)
    out = run(context)
    assert sorted(i for i, _ in context.failed) == [1, 3]
    assert int(out[1].sum()) == int(out[3].sum()) == 0 and int(out[0].sum()) > 0
