"""Real photographs for benchmarks and tests, made offline from the two photos scikit-learn ships.

Why: what an image pipeline costs depends on what its JPEGs hold (detail, size, chroma subsampling), so it
is best measured on photographs, and tests must not download any. scikit-learn's wheel bundles two
(``china.jpg`` and ``flower.jpg``, 640x427 RGB). Every output is a different random crop of one of them,
resampled to ``size`` with Lanczos, sometimes mirrored, shifted a little in brightness and white balance,
and saved as a baseline JPEG (4:2:0, standard Huffman tables) at a random quality.

Invariants:
- Photo ``index`` depends only on ``(seed, index, size, quality)``: its generator is seeded with
  ``SeedSequence((seed, index))``. Splitting the work over processes cannot change a byte, and
  ``photo_bytes`` holds exactly the files ``make_photos`` writes with the same arguments.
- One seed gives byte-identical files for the same numpy and Pillow builds: nothing in them comes from the
  clock or the machine (no EXIF, no timestamps).
- Photo ``index`` is in class ``index % num_classes``, so class sizes differ by at most one. Labels carry no
  visual signal: every class draws from both sources alike.
- About one photo in five (``PORTRAIT_FRACTION``) is portrait: width and height swapped.

Enlarging a 640x427 source smooths away the texture a camera of that resolution would have recorded, and a
smooth image compresses and decodes unlike a photo. Luma grain (Gaussian, up to ``GRAIN_SIGMA`` levels, in
proportion to how far past 1x the crop was enlarged) puts the texture back. With it, large photos
(2000x1500) at quality 90 take 0.1-0.25 bytes per pixel, as camera photos of that size do; ImageNet-size
ones (500x375), enlarged less, keep more detail per pixel and take 0.1-0.6 at the default qualities.
``tests/test_photos.py`` checks both ranges.

    python -m testkit.photos OUT --num 5000 [--size 500x375] [--seed 0]
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from PIL import ExifTags, Image, ImageChops, features

PORTRAIT_FRACTION = 0.2
CROP_SCALE = (0.45, 1.0)  # crop side, as a fraction of the largest crop with the output's aspect
BRIGHTNESS = (0.85, 1.15)
CHANNEL_GAIN = (0.94, 1.06)  # per channel, on top of brightness: a white-balance shift
GRAIN_SIGMA = 3.0  # 8-bit levels of luma noise at 2x enlargement and beyond
NUM_WORKERS = 2
POOL_MIN_PIXELS = 128 * 500 * 375  # less work than this finishes before a pool's workers have started
CHUNK_PIXELS = 16_000_000  # photos per pool task: even tasks whatever the size
QUALITY = (85, 95)  # the JPEG quality range, inclusive, a photo's own drawn from it
VARIANT_QUALITY = 90  # re-encoding quality of the grey, CMYK and WebP variants

_SOI = b"\xff\xd8"
_EXIF_HEADER = b"Exif\x00\x00"
_sources: list[Image.Image] | None = None  # per process: loaded in the parent, handed to pool workers


@dataclass(frozen=True, slots=True)
class _Recipe:
    """Everything a photo depends on besides its index."""

    size: tuple[int, int]  # (width, height) of a landscape photo
    seed: int
    quality: tuple[int, int]  # inclusive range

    def __post_init__(self) -> None:
        width, height = self.size
        if not (16 <= width <= 16384 and 16 <= height <= 16384):
            raise ValueError(f"size must be (width, height) with both in [16, 16384], got {self.size}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        low, high = self.quality
        if not 1 <= low <= high <= 100:
            raise ValueError(f"quality must be (low, high) with 1 <= low <= high <= 100, got {self.quality}")


def make_photos(
    root: Path,
    num_photos: int,
    *,
    size: tuple[int, int] = (500, 375),
    num_classes: int = 10,
    seed: int = 0,
    quality: tuple[int, int] = QUALITY,
    num_workers: int | None = None,
) -> list[Path]:
    """Write an ImageFolder tree ``root/class_NN/<index:06d>.jpg``; return the paths, sorted.

    ``root`` must be absent or empty, so a tree never mixes two runs. ``num_workers=None`` uses a pool of
    ``NUM_WORKERS`` processes when the work is large enough to repay starting it; 0 renders here. The pool
    spawns its processes, so a script that calls this needs the ``if __name__ == "__main__":`` guard.
    """
    recipe = _Recipe(size, seed, quality)
    num_workers = _resolve_workers(num_workers, num_photos, size)
    if not 1 <= num_classes <= num_photos:
        raise ValueError(
            f"num_classes must be in [1, num_photos={num_photos}] so every class folder holds a photo, "
            f"got {num_classes}"
        )
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty; remove it or choose an empty folder")
    digits = max(2, len(str(num_classes - 1)))
    paths = [root / f"class_{i % num_classes:0{digits}d}" / f"{i:06d}.jpg" for i in range(num_photos)]
    for folder in sorted({path.parent for path in paths}):
        folder.mkdir(parents=True, exist_ok=True)
    _render_all(recipe, num_photos, num_workers, paths)
    return sorted(paths)


def photo_bytes(
    num_photos: int,
    *,
    size: tuple[int, int] = (500, 375),
    seed: int = 0,
    quality: tuple[int, int] = QUALITY,
    num_workers: int | None = None,
) -> list[bytes]:
    """The photos ``make_photos`` would write, in index order, in memory: for decode-bound benchmarks."""
    recipe = _Recipe(size, seed, quality)
    if num_photos < 0:
        raise ValueError(f"num_photos must be >= 0, got {num_photos}")
    return _render_all(recipe, num_photos, _resolve_workers(num_workers, num_photos, size), None)


def exif_rotated(jpeg: bytes, orientation: int) -> bytes:
    """The same JPEG with an EXIF Orientation tag: a loader must rotate it, and its pixels are untouched.

    The entropy-coded data is copied as is (no re-encoding); an existing EXIF segment is replaced.
    """
    if not 1 <= orientation <= 8:
        raise ValueError(f"orientation must be in [1, 8], got {orientation}")
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = orientation
    payload = exif.tobytes()  # starts with the "Exif\0\0" header
    segment = b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload
    segments, body_start = _app_segments(jpeg)
    kept = [s for s in segments if not (s[1] == 0xE1 and s[4:10] == _EXIF_HEADER)]
    num_app0 = next((i for i, s in enumerate(kept) if s[1] != 0xE0), len(kept))
    # After JFIF's APP0, where Pillow itself puts EXIF.
    return b"".join([_SOI, *kept[:num_app0], segment, *kept[num_app0:], jpeg[body_start:]])


def as_grey(jpeg: bytes) -> bytes:
    """The image as a single-channel (mode L) JPEG: a loader must expand it to RGB or reject it."""
    return _reencode(jpeg, "L", "JPEG", quality=VARIANT_QUALITY)


def as_cmyk(jpeg: bytes) -> bytes:
    """The image as a four-channel CMYK JPEG (Adobe marker), as print workflows leave in datasets."""
    return _reencode(jpeg, "CMYK", "JPEG", quality=VARIANT_QUALITY)


def as_progressive(jpeg: bytes) -> bytes:
    """The image as a progressive JPEG (several scans), which decoders that skip rows must still read."""
    return _reencode(jpeg, "RGB", "JPEG", quality=VARIANT_QUALITY, progressive=True)


def truncated(jpeg: bytes) -> bytes:
    """The first half of the file: a valid header, then the data stops (an interrupted copy)."""
    return jpeg[: len(jpeg) // 2]


def as_png(jpeg: bytes) -> bytes:
    """The decoded pixels as a lossless RGB PNG, to test a loader's non-JPEG path on the same image."""
    return _reencode(jpeg, "RGB", "PNG")


def as_webp(jpeg: bytes) -> bytes:
    """The image as a lossy RGB WebP; RuntimeError when this Pillow was built without WebP."""
    if not features.check("webp"):
        raise RuntimeError("this Pillow was built without WebP support (PIL.features.check('webp') is False)")
    return _reencode(jpeg, "RGB", "WEBP", quality=VARIANT_QUALITY)


def _reencode(data: bytes, mode: str, format_name: str, **options: int) -> bytes:
    with Image.open(io.BytesIO(data)) as image:
        converted = image.convert(mode)
    buffer = io.BytesIO()
    converted.save(buffer, format=format_name, **options)
    return buffer.getvalue()


def _app_segments(jpeg: bytes) -> tuple[list[bytes], int]:
    """The APPn segments right after SOI, each with its marker, and the offset where the rest begins."""
    if jpeg[:2] != _SOI:
        raise ValueError(f"not a JPEG: starts with {jpeg[:2]!r}, expected {_SOI!r}")
    segments: list[bytes] = []
    offset = 2
    while offset + 4 <= len(jpeg) and jpeg[offset] == 0xFF and 0xE0 <= jpeg[offset + 1] <= 0xEF:
        end = offset + 2 + int.from_bytes(jpeg[offset + 2 : offset + 4], "big")
        segments.append(jpeg[offset:end])
        offset = end
    return segments, offset


def _source_photos() -> list[Image.Image]:
    global _sources
    if _sources is None:
        from sklearn.datasets import load_sample_images  # heavy import: only where it is needed

        _sources = [Image.fromarray(np.asarray(array)) for array in load_sample_images().images]
    return _sources


def _init_worker(arrays: list[NDArray[np.uint8]]) -> None:
    global _sources
    _sources = [Image.fromarray(array) for array in arrays]


def _render(recipe: _Recipe, index: int) -> bytes:
    """Photo ``index``; the draws come in a fixed order from a generator of its own."""
    rng = np.random.default_rng(np.random.SeedSequence((recipe.seed, index)))
    sources = _source_photos()
    source = sources[int(rng.integers(len(sources)))]
    width, height = recipe.size
    if rng.random() < PORTRAIT_FRACTION:
        width, height = height, width
    source_width, source_height = source.size
    crop_width = min(source_width, source_height * width / height) * rng.uniform(*CROP_SCALE)
    crop_height = crop_width * height / width
    left = rng.uniform(0.0, source_width - crop_width)
    top = rng.uniform(0.0, source_height - crop_height)
    box = (left, top, left + crop_width, top + crop_height)
    image = source.resize((width, height), Image.Resampling.LANCZOS, box=box)
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    gains = rng.uniform(*BRIGHTNESS) * rng.uniform(*CHANNEL_GAIN, size=3)
    tables = np.clip(np.rint(np.arange(256.0)[None, :] * gains[:, None]), 0, 255)  # (3, 256): R, G, B
    image = image.point(tables.astype(np.uint8).ravel().tolist())
    quality = int(rng.integers(recipe.quality[0], recipe.quality[1] + 1))
    sigma = GRAIN_SIGMA * min(1.0, max(0.0, width / crop_width - 1.0))
    if sigma > 0.0:
        grain = rng.standard_normal((height, width), dtype=np.float32) * np.float32(sigma) + np.float32(128.5)
        np.clip(grain, 0.0, 255.0, out=grain)
        grain_image = Image.fromarray(grain.astype(np.uint8))  # 128 = no change
        # The same on every channel: luma grain, as a sensor's mostly is.
        image = ImageChops.add(image, Image.merge("RGB", [grain_image] * 3), offset=-128)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality, subsampling="4:2:0")
    return buffer.getvalue()


_Task = tuple[_Recipe, range, list[Path] | None]


def _render_chunk(task: _Task) -> list[bytes]:
    """Render a run of indices; write them to ``paths`` (returning nothing) when given."""
    recipe, indices, paths = task
    if paths is None:
        return [_render(recipe, index) for index in indices]
    for index, path in zip(indices, paths, strict=True):
        path.write_bytes(_render(recipe, index))
    return []


def _resolve_workers(num_workers: int | None, num_photos: int, size: tuple[int, int]) -> int:
    if num_workers is None:
        return NUM_WORKERS if num_photos * size[0] * size[1] >= POOL_MIN_PIXELS else 0
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0 (0: render in this process), got {num_workers}")
    return num_workers


def _render_all(recipe: _Recipe, num_photos: int, num_workers: int, paths: list[Path] | None) -> list[bytes]:
    width, height = recipe.size
    per_task = max(1, CHUNK_PIXELS // (width * height))
    tasks: list[_Task] = [
        (
            recipe,
            range(start, min(start + per_task, num_photos)),
            None if paths is None else paths[start : start + per_task],
        )
        for start in range(0, num_photos, per_task)
    ]
    if num_workers == 0:
        chunks = [_render_chunk(task) for task in tasks]
    else:
        arrays = [np.asarray(image) for image in _source_photos()]
        # spawn, not fork: the caller may hold threads (torch, a test runner) whose locks fork would copy.
        context = multiprocessing.get_context("spawn")
        with context.Pool(num_workers, initializer=_init_worker, initargs=(arrays,)) as pool:
            chunks = list(pool.imap(_render_chunk, tasks))  # in task order, whichever worker finishes first
            pool.close()
            pool.join()
    return [data for chunk in chunks for data in chunk]


def _parse_size(text: str) -> tuple[int, int]:
    width, sep, height = text.lower().partition("x")
    if not (sep and width.isdigit() and height.isdigit()):
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT such as 500x375, got {text!r}")
    return int(width), int(height)


def _parse_quality(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    if not (low.isdigit() and (high or low).isdigit()):
        raise argparse.ArgumentTypeError(f"expected LOW-HIGH such as 85-95, or one value, got {text!r}")
    return int(low), int(high or low)


CLI_DESCRIPTION = """\
Write seeded photographs as an ImageFolder tree OUT/class_NN/<index:06d>.jpg, made from the two photos
bundled with scikit-learn (nothing is downloaded): random crops, resampled to --size, about one in five
portrait, saved as baseline 4:2:0 JPEGs. The same arguments give byte-identical files, whatever --workers.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m testkit.photos",
        description=CLI_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("out", type=Path, metavar="OUT", help="folder to create; it must be absent or empty")
    parser.add_argument("--num", type=int, required=True, metavar="N", help="number of photos")
    parser.add_argument(
        "--size", type=_parse_size, default=(500, 375), metavar="WxH",
        help="size of landscape photos, portrait ones swapped (default 500x375, ImageNet-like; 2000x1500 "
        "is camera-like)",
    )  # fmt: skip
    parser.add_argument(
        "--seed", type=int, default=0, metavar="S", help="photo i depends only on (S, i, size, quality)"
    )
    parser.add_argument(
        "--classes", type=int, default=10, help="class folders, filled round-robin (default 10)"
    )
    parser.add_argument(
        "--quality", type=_parse_quality, default=QUALITY, metavar="LOW-HIGH",
        help=f"JPEG quality, drawn per photo from this inclusive range (default {QUALITY[0]}-{QUALITY[1]})",
    )  # fmt: skip
    parser.add_argument(
        "--workers",
        type=int,
        default=NUM_WORKERS,
        help=f"processes; 0 renders in this one (default {NUM_WORKERS})",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, make the tree, print its size; exit 2 for bad arguments, 1 for a non-empty OUT."""
    parser = _parser()
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        paths = make_photos(
            args.out, args.num, size=args.size, num_classes=args.classes, seed=args.seed,
            quality=args.quality, num_workers=args.workers,
        )  # fmt: skip
    except ValueError as error:
        parser.error(str(error))
    except FileExistsError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - start
    num_bytes = sum(path.stat().st_size for path in paths)
    width, height = args.size
    num_pixels = width * height * len(paths)  # a portrait photo has the same area
    print(
        f"wrote {len(paths):,} photos in {args.classes} classes to {args.out}: {num_bytes / 2**20:,.1f} MiB, "
        f"{num_bytes / num_pixels:.3f} bytes/pixel, {seconds:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
