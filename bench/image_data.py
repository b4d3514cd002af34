"""The image profiles' data: real photographs (:mod:`bench.photos`, nothing downloaded) and their packs.

A profile fixes the photo count, the landscape size (about one photo in five is portrait) and the seed.
Its folder holds the ImageFolder tree (``files/class_NN/<index>.jpg``), shardpipe's tar pack of it
(``tar``: labels from the class folders, the photos as they are) and the same pack prepared at pack time
(``tar-256``: ``PackOptions(image_max_side=256)``, each photo shrunk to a longest side of 256). The photos
depend on the profile and on numpy's and Pillow's builds, which the fingerprint names, so the folder is
reused until one of them changes; the packs are redone, the photos kept, when shardpipe's packing code
changes (:func:`bench.data.packer_fingerprint`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.data import NUM_CLASSES, NUM_SHARDS, packer_fingerprint
from bench.photos import make_photos
from shardpipe import PackOptions, pack
from shardpipe.manifest import load_manifest

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
            {**asdict(self), "version": IMAGE_DATA_VERSION, "classes": NUM_CLASSES,
             "numpy": numpy.__version__, "pillow": PIL.__version__},
            sort_keys=True,
        )  # fmt: skip
        return hashlib.sha256(text.encode()).hexdigest()[:16]


IMAGE_PROFILES = {
    "images": ImageProfile("images", 5_000, (500, 375)),  # ImageNet-like
    "images-large": ImageProfile("images-large", 500, (2000, 1500)),  # camera-like
}
QUICK_IMAGE_PROFILES = {
    "images": ImageProfile("images", 64, (500, 375)),
    "images-large": ImageProfile("images-large", 16, (2000, 1500)),
}


@dataclass(frozen=True, slots=True)
class ImageData:
    """Where one image profile's data lives."""

    profile: ImageProfile
    root: Path

    @property
    def tree(self) -> Path:
        return self.root / "files"

    def packed(self, name: str = "tar") -> Path:
        return self.root / name

    def files(self) -> list[Path]:
        """The photos in key order."""
        return sorted(self.tree.rglob("*.jpg"))

    def shard_files(self, name: str = "tar") -> list[Path]:
        root = self.packed(name)
        return [root / entry.path for entry in load_manifest(root).split_shards("train")]

    @property
    def payload_bytes(self) -> int:
        return int(json.loads((self.root / "ready.json").read_text())["payload_bytes"])


def prepare_images(profile: ImageProfile, cache: Path, *, workers: int = 2, log: bool = True) -> ImageData:
    """The profile's photos and packs under ``cache``, made when their fingerprint is absent."""
    data = ImageData(profile, Path(cache) / f"{profile.name}-{profile.fingerprint}")
    ready, packer = data.root / "ready.json", packer_fingerprint()
    if ready.exists() and json.loads(ready.read_text()).get("packer") == packer:
        return data
    if ready.exists():  # the same photos, but shardpipe's packing code changed since: repack only
        ready.unlink()
        for name in PACKS:
            shutil.rmtree(data.packed(name), ignore_errors=True)
    else:
        shutil.rmtree(data.root, ignore_errors=True)  # an interrupted build: start over
        if log:
            width, height = profile.size
            print(f"building {profile.name} data: {profile.num_photos:,} photos of ~{width}x{height}")
        make_photos(data.tree, profile.num_photos, size=profile.size, num_classes=NUM_CLASSES,
                    seed=profile.seed, num_workers=max(workers, 1))  # fmt: skip
    per_shard = max(-(-profile.num_photos // NUM_SHARDS), 1)
    for name, max_side in PACKS.items():
        if log:
            print(
                f"  packing {data.packed(name)} (tar{f', --image-max-side {max_side}' if max_side else ''})"
            )
        options = PackOptions(format="tar", labels="dirname", max_samples=per_shard, max_bytes=None,
                              workers=max(workers, 1), image_max_side=max_side)  # fmt: skip
        pack(data.tree, data.packed(name), options, quiet=True)
    info = {
        "profile": asdict(profile),
        "fingerprint": profile.fingerprint,
        "payload_bytes": sum(path.stat().st_size for path in data.files()),
        "packer": packer,
    }
    ready.write_text(json.dumps(info, indent=1))
    return data
