"""testkit.photos: seeded photographs, byte-identical per seed and across processes, photo-like in size."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray
from PIL import Image, ImageOps, JpegImagePlugin, features

from testkit import photos

REPO = Path(__file__).resolve().parents[1]
SMALL = (64, 48)  # enough for crops, flips and grain; fast where the size itself is not under test


def decode(data: bytes) -> NDArray[np.uint8]:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image)


def open_image(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def quantization_tables(quality: int) -> dict[int, list[int]]:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buffer, format="JPEG", quality=quality)
    return open_image(buffer.getvalue()).quantization  # type: ignore[attr-defined, no-any-return]


@pytest.fixture(scope="module")
def imagenet_size() -> list[bytes]:
    return photos.photo_bytes(40, seed=0)


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    first = photos.photo_bytes(6, size=SMALL, seed=3)
    assert first == photos.photo_bytes(6, size=SMALL, seed=3)
    others = photos.photo_bytes(6, size=SMALL, seed=4)
    assert all(a != b for a, b in zip(first, others, strict=True))


def test_photo_depends_on_its_index_only() -> None:
    # A prefix of a longer run is the shorter run: nothing carries over from one photo to the next.
    assert photos.photo_bytes(5, size=SMALL) == photos.photo_bytes(9, size=SMALL)[:5]


def test_pool_gives_the_single_process_bytes() -> None:
    alone = photos.photo_bytes(12, size=SMALL, num_workers=0)
    assert photos.photo_bytes(12, size=SMALL, num_workers=2) == alone


def test_every_photo_differs(imagenet_size: list[bytes]) -> None:
    assert len({hashlib.sha256(data).digest() for data in imagenet_size}) == len(imagenet_size)
    landscape = [decode(data) for data in imagenet_size if open_image(data).width == 500]
    for index, pixels in enumerate(landscape[:-1]):
        difference = np.abs(pixels.astype(np.int16) - landscape[index + 1]).mean()
        assert difference > 5, f"photos {index} and {index + 1} look alike (mean difference {difference:.1f})"


def test_imagenet_size_photos_are_plain_baseline_jpegs(imagenet_size: list[bytes]) -> None:
    allowed_tables = [quantization_tables(quality) for quality in range(85, 96)]
    num_portrait = 0
    for data in imagenet_size:
        image = open_image(data)
        assert isinstance(image, JpegImagePlugin.JpegImageFile)
        assert image.mode == "RGB"
        assert image.size in {(500, 375), (375, 500)}
        num_portrait += image.height > image.width
        assert JpegImagePlugin.get_sampling(image) == 2  # 4:2:0
        assert "progressive" not in image.info and "progression" not in image.info
        assert "exif" not in image.info
        assert image.quantization in allowed_tables  # saved at a quality in (85, 95)
        assert 0.1 <= len(data) / (500 * 375) <= 0.6
    assert 0.05 * len(imagenet_size) <= num_portrait <= 0.4 * len(imagenet_size)


def test_large_photos_take_photo_like_bytes_per_pixel() -> None:
    # Upscaled 3x or more: without grain these would be far smoother (fewer bytes) than a real photo.
    for data in photos.photo_bytes(3, size=(2000, 1500), quality=(90, 90)):
        image = open_image(data)
        assert image.size in {(2000, 1500), (1500, 2000)}
        bytes_per_pixel = len(data) / (2000 * 1500)
        assert 0.1 <= bytes_per_pixel <= 0.25, f"{bytes_per_pixel:.3f} bytes per pixel"


def test_image_folder_layout(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    paths = photos.make_photos(root, 25, size=SMALL, num_classes=10, num_workers=0)
    assert paths == sorted(paths) == sorted(root.rglob("*.jpg"))
    assert sorted(p.name for p in root.iterdir()) == [f"class_{k:02d}" for k in range(10)]
    counts = [len(list((root / f"class_{k:02d}").iterdir())) for k in range(10)]
    assert counts == [3] * 5 + [2] * 5
    assert {p.relative_to(root).as_posix() for p in paths} == {
        f"class_{i % 10:02d}/{i:06d}.jpg" for i in range(25)
    }
    by_index = sorted(paths, key=lambda p: p.name)
    assert [p.read_bytes() for p in by_index] == photos.photo_bytes(25, size=SMALL)


def test_many_classes_get_wider_names(tmp_path: Path) -> None:
    paths = photos.make_photos(tmp_path / "tree", 101, size=(16, 16), num_classes=101, num_workers=0)
    assert {p.parent.name for p in paths} == {f"class_{k:03d}" for k in range(101)}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"num_photos": 5, "num_classes": 10}, "num_classes must be in"),
        ({"size": (8, 48)}, "size must be"),
        ({"quality": (95, 85)}, "quality must be"),
        ({"seed": -1}, "seed must be"),
        ({"num_workers": -1}, "num_workers must be"),
    ],
)
def test_bad_arguments_name_the_value(tmp_path: Path, arguments: dict[str, object], message: str) -> None:
    options: dict[str, object] = {"num_photos": 10, "size": SMALL, **arguments}
    with pytest.raises(ValueError, match=message):
        photos.make_photos(tmp_path / "tree", **options)  # type: ignore[arg-type]
    assert not (tmp_path / "tree").exists()  # checked before anything is written


def test_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "stale.jpg").write_bytes(b"")
    with pytest.raises(FileExistsError, match="not empty"):
        photos.make_photos(tmp_path, 10, size=SMALL)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_rotated_tags_without_touching_pixels(orientation: int) -> None:
    original = photos.photo_bytes(1, size=SMALL)[0]
    pixels = decode(original)
    rotated = photos.exif_rotated(original, orientation)
    image = open_image(rotated)
    assert image.getexif()[0x0112] == orientation
    assert np.array_equal(np.asarray(image), pixels)
    expected = {
        1: pixels,
        2: pixels[:, ::-1],
        3: np.rot90(pixels, 2),
        4: pixels[::-1],
        5: pixels.transpose(1, 0, 2),
        6: np.rot90(pixels, -1),  # the camera was turned clockwise
        7: np.rot90(pixels, 2).transpose(1, 0, 2),
        8: np.rot90(pixels, 1),
    }[orientation]
    assert np.array_equal(np.asarray(ImageOps.exif_transpose(image)), expected)


def test_exif_rotated_replaces_an_existing_tag() -> None:
    original = photos.photo_bytes(1, size=SMALL)[0]
    twice = photos.exif_rotated(photos.exif_rotated(original, 6), 3)
    assert open_image(twice).getexif()[0x0112] == 3
    assert twice.count(b"Exif\x00\x00") == 1
    assert len(twice) == len(photos.exif_rotated(original, 3))


def test_exif_rotated_rejects_bad_input() -> None:
    original = photos.photo_bytes(1, size=SMALL)[0]
    with pytest.raises(ValueError, match="orientation must be in"):
        photos.exif_rotated(original, 9)
    with pytest.raises(ValueError, match="not a JPEG"):
        photos.exif_rotated(photos.as_png(original), 6)


def test_variants_decode_in_their_modes() -> None:
    original = photos.photo_bytes(1, size=SMALL)[0]
    pixels = decode(original).astype(np.int16)
    grey = open_image(photos.as_grey(original))
    cmyk = open_image(photos.as_cmyk(original))
    assert (grey.format, grey.mode, grey.size) == ("JPEG", "L", SMALL)
    assert (cmyk.format, cmyk.mode, cmyk.size) == ("JPEG", "CMYK", SMALL)
    assert np.abs(np.asarray(cmyk.convert("RGB")) - pixels).mean() < 5  # not inverted by the round trip
    png = open_image(photos.as_png(original))
    assert (png.format, png.mode) == ("PNG", "RGB")
    assert np.array_equal(np.asarray(png), pixels)  # lossless: exactly the decoded JPEG
    progressive = open_image(photos.as_progressive(original))
    assert progressive.info.get("progressive") and np.abs(np.asarray(progressive) - pixels).mean() < 5
    cut = photos.truncated(original)
    assert Image.open(io.BytesIO(cut)).size == SMALL and not cut.endswith(
        b"\xff\xd9"
    )  # header kept, end gone


@pytest.mark.skipif(not features.check("webp"), reason="this Pillow was built without WebP")
def test_webp_variant() -> None:
    original = photos.photo_bytes(1, size=SMALL)[0]
    webp = open_image(photos.as_webp(original))
    assert (webp.format, webp.mode, webp.size) == ("WEBP", "RGB", SMALL)
    assert np.abs(np.asarray(webp) - decode(original).astype(np.int16)).mean() < 8


def test_cli_writes_the_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    argv = [str(out), "--num", "12", "--size", "64x48", "--seed", "5", "--classes", "3", "--workers", "0"]
    assert photos.main(argv) == 0
    assert "wrote 12 photos in 3 classes" in capsys.readouterr().out
    written = sorted(out.rglob("*.jpg"), key=lambda p: p.name)
    assert [p.read_bytes() for p in written] == photos.photo_bytes(12, size=SMALL, seed=5)
    assert photos.main(argv) == 1  # OUT is no longer empty
    with pytest.raises(SystemExit) as exit_info:
        photos.main([str(tmp_path / "other"), "--num", "12", "--size", "64by48"])
    assert exit_info.value.code == 2


@pytest.mark.slow
def test_module_runs_with_a_pool(tmp_path: Path) -> None:
    # python -m with spawned workers: they must find the module's functions under __main__.
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "testkit.photos",
        str(out),
        "--num",
        "10",
        "--size",
        "64x48",
        "--workers",
        "2",
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    written = sorted(out.rglob("*.jpg"), key=lambda p: p.name)
    assert [p.read_bytes() for p in written] == photos.photo_bytes(10, size=SMALL)


def test_help_explains_the_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "testkit.photos", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    for word in ("ImageFolder", "--num", "--size", "--seed", "byte-identical"):
        assert word in done.stdout
