"""The image profiles' data: real photographs (:mod:`testkit.photos`, nothing downloaded) and their packs.

A profile fixes the photo count, the landscape size (about one photo in five is portrait) and the seed.
Its folder holds the ImageFolder tree (``files/class_NN/<index>.jpg``), shardpipe's tar pack of it
(``tar``: labels from the class folders, the photos as they are) and the same pack prepared at pack time
(``tar-<PREPARED_MAX_SIDE>``: ``PackOptions(image_max_side=PREPARED_MAX_SIDE)``, each photo shrunk to that
longest side). The photos depend on the profile and on numpy's and Pillow's builds, which the fingerprint
names, so the folder is reused until one of them changes; the packs are redone, the photos kept, when
shardpipe's packing code changes (:func:`bench.io.data.refresh`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from bench.io.data import NUM_CLASSES, NUM_SHARDS, DataFolder, refresh
from shardpipe import PackOptions, pack
from testkit.photos import make_photos

IMAGE_DATA_VERSION = 1
PREPARED_MAX_SIDE = 256
PACKS = {"tar": None, f"tar-{PREPARED_MAX_SIDE}": PREPARED_MAX_SIDE}  # pack folder -> image_max_side


@dataclass(frozen=True, slots=True)
class ImageProfile:
    name: str
    num_photos: int
    size: tuple[int, int]  # (width, height) of a landscape photo
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_photos < NUM_CLASSES:
            raise ValueError(f"profile {self.name}: need >= {NUM_CLASSES} photos, one per class, got {self}")
        if min(self.size) <= PREPARED_MAX_SIDE:
            raise ValueError(f"profile {self.name}: photos must be larger than {PREPARED_MAX_SIDE} px")

    @property
    def fingerprint(self) -> str:
        import numpy
        import PIL

        text = json.dumps(
            {
                **asdict(self),
                "version": IMAGE_DATA_VERSION,
                "classes": NUM_CLASSES,
                "numpy": numpy.__version__,
                "pillow": PIL.__version__,
            },
            sort_keys=True,
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]


IMAGE_PROFILES = {
    "images": ImageProfile("images", 5_000, (500, 375)),  # ImageNet-like
    "images-large": ImageProfile("images-large", 500, (2000, 1500)),  # camera-like
}
QUICK_IMAGE_PROFILES = {
    "images": ImageProfile("images", 64, (500, 375)),
    "images-large": ImageProfile("images-large", 16, (2000, 1500)),
}


# (warmup, steps) per profile; a window may span epochs (an image run cycles them)
IMAGE_WINDOWS = {"images": (5, 80), "images-large": (2, 24)}
QUICK_IMAGE_WINDOWS = {"images": (1, 3), "images-large": (1, 2)}


@dataclass(frozen=True, slots=True)
class ImageData(DataFolder):
    """Where one image profile's data lives."""

    profile: ImageProfile
    root: Path
    suffix: ClassVar[str] = ".jpg"


def prepare_images(profile: ImageProfile, cache: Path, *, workers: int = 2, log: bool = True) -> ImageData:
    """The profile's photos and packs under ``cache``, made when their fingerprint is absent."""
    data = ImageData(profile, Path(cache) / f"{profile.name}-{profile.fingerprint}")

    def make_tree() -> int:
        if log:
            width, height = profile.size
            print(f"building {profile.name} data: {profile.num_photos:,} photos of ~{width}x{height}")
        make_photos(
            data.tree,
            profile.num_photos,
            size=profile.size,
            num_classes=NUM_CLASSES,
            seed=profile.seed,
            num_workers=max(workers, 1),
        )
        return sum(path.stat().st_size for path in data.files())

    def make_packs() -> None:
        per_shard = max(-(-profile.num_photos // NUM_SHARDS), 1)
        for name, max_side in PACKS.items():
            if log:
                option = f", --image-max-side {max_side}" if max_side else ""
                print(f"  packing {data.packed(name)} (tar{option})")
            options = PackOptions(
                format="tar",
                labels="dirname",
                max_samples=per_shard,
                max_bytes=None,
                workers=max(workers, 1),
                image_max_side=max_side,
            )
            pack(data.tree, data.packed(name), options, quiet=True)

    refresh(
        data.root,
        {"profile": asdict(profile), "fingerprint": profile.fingerprint},
        PACKS,
        make_tree,
        make_packs,
    )
    return data
