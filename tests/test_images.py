"""The built-in image preparation at pack time: shrunk to a longest side, upright, reproducible, small
images untouched, every mode and format handled, undecodable images named."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image, ImageOps

from shardpipe.cli import main
from shardpipe.errors import UsageError
from shardpipe.packing import PackOptions, pack
from shardpipe.packing.images import ImagePreparation
from shardpipe.packing.mapping import MapError
from shardpipe.packing.output import JobMismatchError
from testkit.photos import as_cmyk, as_grey, as_png, as_webp, exif_rotated, make_photos, photo_bytes
from tests.test_pack import read_back

PHOTO = photo_bytes(1, size=(500, 375), seed=7)[0]


def decoded(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def psnr(a: Image.Image, b: Image.Image) -> float:
    x, y = (np.asarray(i.convert("RGB"), dtype=np.float64) for i in (a, b))
    error = float(np.mean((x - y) ** 2))
    return float("inf") if error == 0 else 10 * float(np.log10(255**2 / error))


def test_a_large_image_shrinks_to_the_longest_side_and_a_small_one_is_kept() -> None:
    prepare = ImagePreparation(256, quality=90)
    out = decoded(prepare.prepare(PHOTO))
    assert out.size == (256, 192) and out.format == "JPEG"
    reference = decoded(PHOTO).resize((256, 192), Image.Resampling.LANCZOS)
    assert psnr(out, reference) > 30
    assert prepare.prepare(PHOTO) == prepare.prepare(PHOTO)  # byte-reproducible
    assert ImagePreparation(500).prepare(PHOTO) == PHOTO  # no larger than the limit: untouched
    assert prepare({"jpg": PHOTO, "cls": b"3"})["cls"] == b"3"  # only image fields change


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied_before_resizing(orientation: int) -> None:
    rotated = exif_rotated(PHOTO, orientation)
    out = decoded(ImagePreparation(200).prepare(rotated))
    upright = ImageOps.exif_transpose(decoded(rotated))
    assert out.size == ((200, 150) if upright.width > upright.height else (150, 200))
    assert psnr(out, upright.resize(out.size, Image.Resampling.LANCZOS)) > 30
    assert 0x0112 not in out.getexif()  # the orientation is in the pixels now


@pytest.mark.parametrize(
    ("make", "mode", "fmt"),
    [(as_grey, "L", "JPEG"), (as_cmyk, "CMYK", "JPEG"), (as_png, "RGB", "PNG"), (as_webp, "RGB", "WEBP")],
)
def test_every_mode_and_format_keeps_itself(make: object, mode: str, fmt: str) -> None:
    source = make(PHOTO)  # type: ignore[operator]
    out = decoded(ImagePreparation(128, quality=85).prepare(source))
    assert (out.mode, out.format, max(out.size)) == (mode, fmt, 128)
    assert psnr(out, decoded(source).resize(out.size, Image.Resampling.LANCZOS)) > 28


def test_settings_are_checked() -> None:
    for bad in ({"max_side": 0}, {"max_side": 10, "quality": 0}, {"max_side": 10, "quality": 101}):
        with pytest.raises(UsageError):
            ImagePreparation(**bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="give it too"):
        PackOptions(format="tar", image_quality=80)


def test_a_pack_prepares_its_images_records_the_settings_and_resumes_only_the_same(tmp_path: Path) -> None:
    make_photos(tmp_path / "src", 24, num_classes=3, seed=1)
    out = tmp_path / "out"
    args = [
        "--format",
        "tar",
        "--labels",
        "dirname",
        "--image-max-side",
        "160",
        "--image-quality",
        "80",
        "-q",
    ]
    result = CliRunner().invoke(main, ["pack", str(tmp_path / "src"), str(out), *args])
    assert result.exit_code == 0, result.output
    images = [decoded(s["jpg"]) for s in read_back(out)["train"].values()]
    assert len(images) == 24 and all(max(i.size) == 160 for i in images)
    recorded = json.loads((out / "manifest.json").read_text())["job"]["options"]["image"]
    assert recorded["max_side"] == 160 and recorded["quality"] == 80 and recorded["pillow"]
    again = CliRunner().invoke(main, ["pack", str(tmp_path / "src"), str(out), *args, "--resume"])
    assert again.exit_code == 0 and "already complete" in again.output
    options = PackOptions(format="tar", labels="dirname", image_max_side=160, image_quality=90, resume=True)
    with pytest.raises(JobMismatchError, match="image: found"):
        pack(tmp_path / "src", out, options, quiet=True)


def test_an_undecodable_image_is_named_or_skipped(tmp_path: Path) -> None:
    make_photos(tmp_path / "src", 6, num_classes=2, seed=2)
    broken = sorted((tmp_path / "src").rglob("*.jpg"))[3]
    broken.write_bytes(b"\xff\xd8 not a jpeg at all")
    key = broken.relative_to(tmp_path / "src").with_suffix("").as_posix()
    options = PackOptions(format="lmdb", image_max_side=64, workers=1)
    with pytest.raises(MapError, match=f"sample '{key}'.*UnidentifiedImageError"):
        pack(tmp_path / "src", tmp_path / "out", options, quiet=True)
    skipping = PackOptions(format="lmdb", image_max_side=64, on_error="skip")
    result = pack(tmp_path / "src", tmp_path / "skip", skipping, quiet=True)
    assert result.num_skipped_failed == 1 and result.manifest.skipped["samples"][0]["key"] == key
