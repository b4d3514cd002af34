"""The pack benchmark's trees, each built once per fingerprint under the cache folder and reused.

``small`` and ``large`` (:class:`Profile`): one ``.bin`` file per sample in ten class folders, seeded
random bytes. ``images`` (:class:`PhotoProfile`): an ImageFolder tree of real photos (:mod:`testkit.photos`,
nothing downloaded). ``parquet`` (:class:`ParquetProfile`): the same rows twice, as a Hugging Face-style
folder and as a flat Parquet list with a ``key`` column. A tree is complete once its ``complete.json``
exists; anything else under its folder is removed and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

DATA_VERSION = 1  # of the byte trees' recipe
PHOTO_DATA_VERSION = 1  # of the photo trees' recipe
PARQUET_DATA_VERSION = 1  # of the Parquet sources' recipe
HF_FOLDER = "hf"  # the Hugging Face-style folder, under a Parquet profile's tree
HF_FILE = "data/train-00000-of-00001.parquet"  # its one file, named as push_to_hub names it
FLAT_LIST = "flat/list.parquet"  # the flat list, under the same tree
NUM_CLASSES = 10  # class folders of every tree
SEED = 20240  # of every tree


def fingerprint(recipe: dict[str, Any]) -> str:
    """A short hash of what a tree is made from: a tree is reused only while its recipe is the same."""
    return hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    num_samples: int
    sample_bytes: int

    @property
    def fingerprint(self) -> str:
        """Names the tree's content: a change to any of these rebuilds it instead of reusing it."""
        return fingerprint({**asdict(self), "v": DATA_VERSION, "classes": NUM_CLASSES, "seed": SEED})

    @property
    def payload_bytes(self) -> int:
        return self.num_samples * self.sample_bytes


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
        if self.num_samples < NUM_CLASSES:
            raise ValueError(f"num_samples must be >= {NUM_CLASSES}, one per class, got {self.num_samples}")
        if not 1 <= self.max_side < max(self.size):
            raise ValueError(
                f"max_side must be in [1, {max(self.size) - 1}] so every photo is shrunk, got {self.max_side}"
            )

    @property
    def fingerprint(self) -> str:
        """Names the tree's content: the photos depend on the recipe and on numpy's and Pillow's builds."""
        import PIL

        return fingerprint(
            {
                "n": self.num_samples,
                "size": self.size,
                "v": PHOTO_DATA_VERSION,
                "classes": NUM_CLASSES,
                "seed": SEED,
                "numpy": np.__version__,
                "pillow": PIL.__version__,
            }
        )


@dataclass(frozen=True, slots=True)
class ParquetProfile:
    """``num_samples`` rows of ``sample_bytes`` random bytes (a binary column ``bin``) and an int64
    ``label``, in row groups of ``group_rows`` (what ``datasets`` writes for binary features)."""

    name: str
    num_samples: int
    sample_bytes: int = 1024
    group_rows: int = 100

    @property
    def fingerprint(self) -> str:
        """Names the sources' content: a change to any of these rebuilds them instead of reusing them."""
        return fingerprint({**asdict(self), "v": PARQUET_DATA_VERSION, "classes": NUM_CLASSES, "seed": SEED})

    @property
    def payload_bytes(self) -> int:
        """The binary column's bytes (the labels' few bytes a row left out, as a tree's class folders are)."""
        return self.num_samples * self.sample_bytes


def build_tree(profile: Profile, cache: Path) -> Path:
    """Return the profile's tree, writing it first unless a complete one with this fingerprint exists."""
    home = cache / f"{profile.name}-{profile.num_samples}-{profile.fingerprint}"
    tree, done = home / "tree", home / "complete.json"
    if done.is_file():
        return tree
    shutil.rmtree(home, ignore_errors=True)
    for c in range(NUM_CLASSES):
        (tree / f"class{c:02d}").mkdir(parents=True)
    rng = np.random.default_rng([SEED, profile.sample_bytes])
    block = max(1, (8 << 20) // profile.sample_bytes)  # samples generated per numpy call
    size = profile.sample_bytes
    for first in range(0, profile.num_samples, block):
        count = min(block, profile.num_samples - first)
        data = rng.bytes(count * size)
        for j in range(count):
            i = first + j
            with open(tree / f"class{i % NUM_CLASSES:02d}" / f"{i:08d}.bin", "wb") as f:
                f.write(data[j * size : (j + 1) * size])
    done.write_text(json.dumps(asdict(profile)))
    return tree


def build_photo_tree(profile: PhotoProfile, cache: Path) -> Path:
    """Return the profile's photo tree, writing it first unless a complete one with this fingerprint
    exists (``ImageFolder`` layout: ``class_NN/<index>.jpg``)."""
    from testkit.photos import make_photos

    home = cache / f"photos-{profile.num_samples}-{profile.fingerprint}"
    tree, done = home / "tree", home / "complete.json"
    if done.is_file():
        return tree
    shutil.rmtree(home, ignore_errors=True)
    make_photos(tree, profile.num_samples, size=profile.size, num_classes=NUM_CLASSES, seed=SEED)
    done.write_text(json.dumps(asdict(profile)))
    return tree


def build_parquet(profile: ParquetProfile, cache: Path) -> Path:
    """Return the profile's folder, writing it first unless a complete one with this fingerprint exists:
    :data:`HF_FOLDER` / :data:`HF_FILE` without a key column and with the schema metadata ``datasets``
    writes (``Value("binary")``, ``ClassLabel``), and :data:`FLAT_LIST`, the same rows with a ``key``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    home = cache / f"{profile.name}-{profile.num_samples}-{profile.fingerprint}"
    tree, done = home / "tree", home / "complete.json"
    if done.is_file():
        return tree
    shutil.rmtree(home, ignore_errors=True)
    rng = np.random.default_rng([SEED, profile.sample_bytes])
    data = rng.bytes(profile.num_samples * profile.sample_bytes)
    size = profile.sample_bytes
    blobs = pa.array([data[i * size : (i + 1) * size] for i in range(profile.num_samples)], pa.binary())
    labels = pa.array(np.arange(profile.num_samples) % NUM_CLASSES, pa.int64())
    features = {
        "bin": {"dtype": "binary", "_type": "Value"},
        "label": {"names": [f"class{c:02d}" for c in range(NUM_CLASSES)], "_type": "ClassLabel"},
    }
    hf = pa.table({"bin": blobs, "label": labels})
    hf = hf.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    keys = pa.array([f"s{i:08d}" for i in range(profile.num_samples)])
    flat = pa.table({"key": keys, "bin": blobs, "label": labels})
    for table, relpath in ((hf, f"{HF_FOLDER}/{HF_FILE}"), (flat, FLAT_LIST)):
        (tree / relpath).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, tree / relpath, row_group_size=profile.group_rows)
    done.write_text(json.dumps(asdict(profile)))
    return tree


def warm(tree: Path) -> tuple[int, int]:
    """Read every file once so all contenders start from the same (warm) page cache; return (files,
    bytes)."""
    files = total = 0
    for dirpath, _, names in os.walk(tree):
        for name in names:
            with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
                total += len(f.readall())
            files += 1
    return files, total
