"""The pack benchmark's preprocessing side: the ``images`` profile and the contenders that are not shardpipe.

* :func:`unchanged` is the no-op map of the ``--map`` rows (``bench.prep_contenders:unchanged``): the cost
  of a map is then shardpipe's alone, none of it the function's.
* :func:`prepare_tree` is the bare pool: ``multiprocessing.Pool(workers)`` applying
  ``ImagePreparation(max_side, quality).prepare`` to every file and writing each result as a file, with
  nothing else around it (no listing beyond ``os.walk``, no framing, no shards, no fsync). With
  ``pack_settings`` its processes are set up as shardpipe's pack processes are (numpy's OpenBLAS without
  threads, :func:`shardpipe.packing.engine.init_worker`: glibc keeps freed memory, the cyclic GC
  paused), so it is the limit of parallel preparation on a machine: the function itself plus the file
  reads and writes. Without them it is the pool as a user writes it, whose decode buffers (larger than
  glibc's mmap threshold) are mapped and page-faulted in afresh for every image.
  ``python -m bench.prep_contenders TREE OUT --max-side N --quality Q --workers W [--pack-settings]``
  runs it as its own process, start-up included, the way the CLI rows are timed.
* :class:`PhotoProfile` and :func:`build_photo_tree` make the profile's tree of real-photo JPEGs
  (:mod:`bench.photos`), cached by fingerprint like the byte trees; :func:`check_prepared` checks a
  contender's output: every image present under its key, each decoding with its longest side
  ``max_side``.

Workers import this module (the map, the pool's task), so it imports only the standard library at the top;
Pillow, numpy and :mod:`bench.photos` load inside the functions that need them.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import multiprocessing
import os
import shutil
import sys
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PHOTO_DATA_VERSION = 1
PHOTO_CLASSES = 10
PHOTO_SEED = 20240
POOL_CHUNK = 16  # files per pool task: few enough round trips that the pool's own cost stays out of sight

Sample = dict[str, Any]
_prepare: Callable[[bytes], bytes] | None = None  # per pool worker, set by _init_worker


def unchanged(sample: Sample) -> Sample:
    """The no-op map: every sample as it came."""
    return sample


@dataclass(frozen=True, slots=True)
class PhotoProfile:
    """A tree of ``num_samples`` photos of about ``size`` (portrait ones swapped), prepared to a longest
    side of ``max_side`` at ``quality``."""

    name: str
    num_samples: int
    size: tuple[int, int] = (500, 375)
    max_side: int = 256
    quality: int = 90

    def __post_init__(self) -> None:
        if self.num_samples < PHOTO_CLASSES:
            raise ValueError(f"num_samples must be >= {PHOTO_CLASSES}, one per class, got {self.num_samples}")
        if not 1 <= self.max_side < max(self.size):
            raise ValueError(
                f"max_side must be in [1, {max(self.size) - 1}] so every photo is shrunk, got {self.max_side}"
            )

    @property
    def fingerprint(self) -> str:
        """Names the tree's content: the photos depend on the recipe and on numpy's and Pillow's builds."""
        import numpy
        import PIL

        text = json.dumps(
            {
                "n": self.num_samples,
                "size": self.size,
                "v": PHOTO_DATA_VERSION,
                "classes": PHOTO_CLASSES,
                "seed": PHOTO_SEED,
                "numpy": numpy.__version__,
                "pillow": PIL.__version__,
            }
        )
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def build_photo_tree(profile: PhotoProfile, cache: Path) -> Path:
    """Return the profile's photo tree, writing it first unless a complete one with this fingerprint
    exists (``ImageFolder`` layout: ``class_NN/<index>.jpg``)."""
    from testkit.photos import make_photos

    home = cache / f"photos-{profile.num_samples}-{profile.fingerprint}"
    tree, done = home / "tree", home / "complete.json"
    if done.is_file():
        return tree
    shutil.rmtree(home, ignore_errors=True)
    make_photos(tree, profile.num_samples, size=profile.size, num_classes=PHOTO_CLASSES, seed=PHOTO_SEED)
    done.write_text(json.dumps(asdict(profile)))
    return tree


def _relpaths(tree: str) -> Iterator[str]:
    """Every file under ``tree``, relative to it, folders and names sorted."""
    for dirpath, dirnames, names in os.walk(tree):
        dirnames.sort()
        rel = os.path.relpath(dirpath, tree)
        for name in sorted(names):
            yield os.path.normpath(os.path.join(rel, name))


def _init_worker(max_side: int, quality: int, pack_settings: bool) -> None:
    global _prepare
    from shardpipe.packing.images import ImagePreparation

    if pack_settings:
        from shardpipe.packing.engine import init_worker

        init_worker()
    _prepare = ImagePreparation(max_side, quality).prepare


def _prepare_file(pair: tuple[str, str]) -> None:
    source, target = pair
    assert _prepare is not None, "the pool's initializer sets the function"
    with open(source, "rb") as f:
        data = f.read()
    with open(target, "wb") as f:
        f.write(_prepare(data))


def prepare_tree(
    tree: str, out: str, max_side: int, quality: int, workers: int, pack_settings: bool = False
) -> None:
    """The bare pool: prepare every file of ``tree`` into the same path under ``out``."""
    if pack_settings:
        from shardpipe.process_settings import single_threaded_blas

        single_threaded_blas()  # before numpy loads, as the shardpipe command does
    import shardpipe.packing.images  # noqa: F401 - once, here: forked workers inherit it, as shardpipe's do

    pairs = [(os.path.join(tree, rel), os.path.join(out, rel)) for rel in _relpaths(tree)]
    for folder in sorted({os.path.dirname(target) for _, target in pairs}):
        os.makedirs(folder, exist_ok=True)
    setup = (max_side, quality, pack_settings)
    with multiprocessing.Pool(workers, initializer=_init_worker, initargs=setup) as pool:
        for _ in pool.imap_unordered(_prepare_file, pairs, chunksize=POOL_CHUNK):
            pass


def check_prepared(layout: str, out: Path, tree: Path, profile: PhotoProfile) -> None:
    """Untimed: every photo of ``tree`` is in ``out`` under its key, decodes, and has its longest side
    ``max_side``. ``layout`` is ``shards`` (shardpipe: ``out/ds`` with a manifest), ``tars`` (ShardWriter:
    ``out/*.tar``) or ``files`` (the bare pool: the tree's paths under ``out``)."""
    expected = {rel.rpartition(".")[0] for rel in _relpaths(str(tree))}
    images: Iterator[tuple[str, bytes]]
    if layout == "files":
        images = ((rel.rpartition(".")[0], (out / rel).read_bytes()) for rel in _relpaths(str(out)))
    elif layout in ("shards", "tars"):
        images = _tar_images(sorted((out / "ds" if layout == "shards" else out).rglob("*.tar")))
    else:
        raise ValueError(f"layout must be shards, tars or files, got {layout!r}")
    if layout == "shards":
        manifest = json.loads((out / "ds" / "manifest.json").read_text())
        count = sum(s["samples"] for split in manifest["splits"].values() for s in split["shards"])
        if count != len(expected):
            raise RuntimeError(f"the manifest counts {count} samples, expected {len(expected)}")
    seen: set[str] = set()
    for key, data in images:
        side = _longest_side(data)
        if side != profile.max_side:
            raise RuntimeError(f"{key}: longest side {side}, expected {profile.max_side}")
        if key in seen:
            raise RuntimeError(f"{key} is written twice")
        seen.add(key)
    if seen != expected:
        missing, extra = sorted(expected - seen), sorted(seen - expected)
        raise RuntimeError(
            f"expected {len(expected)} images, found {len(seen)}: missing {missing[:3]}, "
            f"unexpected {extra[:3]}"
        )


def _tar_images(paths: list[Path]) -> Iterator[tuple[str, bytes]]:
    for path in paths:
        with tarfile.open(path) as archive:
            for member in archive:
                if not member.isfile():
                    continue
                key, _, field = member.name.removeprefix("./").partition(".")
                if field != "jpg":
                    raise RuntimeError(f"{path.name}: {member.name} is not a jpg field")
                handle = archive.extractfile(member)
                assert handle is not None  # a regular file
                yield key, handle.read()


def _longest_side(data: bytes) -> int:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.load()  # decodes every pixel: a truncated or damaged image raises here
        return max(image.size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.prep_contenders", description="The bare pool: prepare every file of TREE."
    )
    parser.add_argument("tree")
    parser.add_argument("out")
    parser.add_argument("--max-side", type=int, required=True)
    parser.add_argument("--quality", type=int, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument(
        "--pack-settings", action="store_true", help="set the processes up as shardpipe's pack processes"
    )
    args = parser.parse_args(argv)
    prepare_tree(args.tree, args.out, args.max_side, args.quality, args.workers, args.pack_settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
