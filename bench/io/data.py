"""Synthetic benchmark data: a tree of small files and its packed copies, rebuilt only when stale.

A profile fixes the sample count and mean size. Every sample is one ``.bin`` file in one of ten class
folders (ImageFolder style; packing adds the ``cls`` label from the folder). Sizes vary by +-25% around the
mean, contents are seeded random bytes (incompressible), so the data depends only on the profile and
``DATA_VERSION``: the fingerprint of those decides whether the cache folder is reused.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

import shardpipe
from bench.io import lmdb_loop
from shardpipe.manifest import load_manifest

DATA_VERSION = 1
FORMATS = ("tar", "lmdb", "tfrecord")
NUM_CLASSES = 10
NUM_SHARDS = 16  # enough shards for webdataset to split over workers, few enough to read sequentially


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    num_samples: int
    sample_bytes: int  # mean payload size of the .bin field

    def __post_init__(self) -> None:
        if self.num_samples < NUM_SHARDS or self.sample_bytes < 16:
            raise ValueError(f"profile {self.name}: need >= {NUM_SHARDS} samples of >= 16 bytes, got {self}")

    @property
    def fingerprint(self) -> str:
        text = json.dumps({**asdict(self), "version": DATA_VERSION, "classes": NUM_CLASSES}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


PROFILES = {
    "small": Profile("small", 60_000, 1024),
    "large": Profile("large", 12_000, 64 * 1024),
}
QUICK_PROFILES = {
    "small": Profile("small", 6_000, 1024),
    "large": Profile("large", 960, 64 * 1024),
}
# (warmup, steps) per profile: the window must fit in one epoch of the profile's data.
WINDOWS = {"small": (10, 400), "large": (10, 150)}
QUICK_WINDOWS = {"small": (3, 30), "large": (2, 8)}


class DataFolder:
    """Where one profile's data lives (mixed into its dataclass, which gives ``root``): the file tree, one
    folder per pack of it, and ``ready.json``, written last, which says both are complete."""

    __slots__ = ()
    root: Path
    suffix: ClassVar[str]

    @property
    def tree(self) -> Path:
        return self.root / "files"

    def packed(self, name: str = "tar") -> Path:
        return self.root / name

    def files(self) -> list[Path]:
        """The sample files in key order (the order the packer sees them)."""
        return sorted(self.tree.rglob(f"*{self.suffix}"))

    def shard_files(self, name: str = "tar", *, with_index: bool = False) -> list[Path]:
        """The shard files of one pack in manifest order (and their offset indexes, if asked)."""
        root = self.packed(name)
        paths: list[Path] = []
        for entry in load_manifest(root).split_shards("train"):
            paths.append(root / entry.path)
            if with_index and entry.index_path is not None:
                paths.append(root / entry.index_path)
        return paths

    @property
    def payload_bytes(self) -> int:
        return int(json.loads((self.root / "ready.json").read_text())["payload_bytes"])


@dataclass(frozen=True, slots=True)
class Dataset(DataFolder):
    """A byte profile's data: the ``.bin`` tree, one pack per format, and the ``lmdb-loop`` copy."""

    profile: Profile
    root: Path
    suffix: ClassVar[str] = ".bin"

    @property
    def lmdb_loop(self) -> Path:
        """The one LMDB of the hand-written ``lmdb-loop`` reader (see ``bench.io.lmdb_loop``)."""
        return self.root / "lmdb-loop"


def refresh(
    root: Path,
    profile: dict[str, Any],
    packs: Iterable[str],
    make_tree: Callable[[], int],
    make_packs: Callable[[], None],
) -> None:
    """Make a profile's data under ``root`` unless ``ready.json`` says it is there, packed by today's
    packer: the tree when it is absent (``make_tree`` returns its payload bytes), the packs when they are
    absent or stale. ``profile`` (its fields and fingerprint) goes into ``ready.json``."""
    ready, packer = root / "ready.json", packer_fingerprint()
    if ready.exists():
        info = json.loads(ready.read_text())
        if info.get("packer") == packer:
            return
        total = int(info["payload_bytes"])  # the same files, but shardpipe's packing code changed: repack
        ready.unlink()
        for name in packs:
            shutil.rmtree(root / name, ignore_errors=True)
    else:
        shutil.rmtree(root, ignore_errors=True)  # an interrupted build: start over
        total = make_tree()
    make_packs()
    ready.write_text(json.dumps({**profile, "payload_bytes": total, "packer": packer}, indent=1))


def sample_sizes(profile: Profile) -> np.ndarray:
    """Per-sample payload sizes, uniform in [0.75, 1.25] x the mean, seeded by the profile."""
    rng = np.random.default_rng([DATA_VERSION, profile.num_samples, profile.sample_bytes])
    low, high = profile.sample_bytes * 3 // 4, profile.sample_bytes * 5 // 4
    return rng.integers(low, high + 1, size=profile.num_samples)


def prepare(profile: Profile, cache: Path, *, workers: int = 2, log: bool = True) -> Dataset:
    """Return the profile's dataset under ``cache``, building and packing it if its fingerprint is absent."""
    dataset = Dataset(profile, Path(cache) / f"{profile.name}-{profile.fingerprint}")

    def make_tree() -> int:
        if log:
            print(
                f"building {profile.name} data: {profile.num_samples:,} files of ~{profile.sample_bytes:,} B"
            )
        return _write_tree(profile, dataset.tree)

    def make_packs() -> None:
        shards = max(profile.num_samples // NUM_SHARDS, 1)
        for format_name in FORMATS:
            command = [
                sys.executable, "-m", "shardpipe", "pack", str(dataset.tree),
                str(dataset.packed(format_name)), "--format", format_name, "--workers", str(workers),
                "--labels", "dirname",
                "--max-samples", str(shards), "--max-bytes", "none", "--quiet",
            ]  # fmt: skip
            if log:
                print("  " + " ".join(command[1:]))
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)

    info = {"profile": asdict(profile), "fingerprint": profile.fingerprint}
    refresh(dataset.root, info, FORMATS, make_tree, make_packs)
    _ensure_lmdb_loop(dataset, log=log)
    return dataset


def _ensure_lmdb_loop(dataset: Dataset, *, log: bool) -> None:
    """Write the lmdb-loop copy from the file tree unless a finished one is there (it depends on the files
    only, not on shardpipe's packer, so a repack keeps it)."""
    done = dataset.lmdb_loop / "done.json"
    if done.exists():
        return
    shutil.rmtree(dataset.lmdb_loop, ignore_errors=True)  # an interrupted build: start over
    if log:
        print(f"  writing {dataset.lmdb_loop} (one LMDB, key = sample index)")
    files = dataset.files()
    samples = ((str(f.relative_to(dataset.tree).with_suffix("")), label_of(f), f.read_bytes()) for f in files)
    count = lmdb_loop.write(dataset.lmdb_loop, samples, dataset.payload_bytes)
    done.write_text(json.dumps({"num_samples": count}))


def packer_fingerprint() -> str:
    """Hash of shardpipe's source: packed copies are stale when the code that wrote them changed."""
    digest = hashlib.sha256()
    for path in sorted(Path(shardpipe.__file__).parent.rglob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def _write_tree(profile: Profile, tree: Path) -> int:
    rng = np.random.default_rng([DATA_VERSION, profile.sample_bytes])
    sizes = sample_sizes(profile)
    pool = rng.integers(0, 256, size=int(sizes.max()) * 4, dtype=np.uint8).tobytes()
    for c in range(NUM_CLASSES):
        (tree / f"c{c}").mkdir(parents=True, exist_ok=True)
    for i, size in enumerate(sizes.tolist()):
        start = (i * 7919) % (
            len(pool) - size
        )  # distinct windows of one random pool: cheap, not compressible
        (tree / f"c{i % NUM_CLASSES}" / f"{i:07d}.bin").write_bytes(pool[start : start + size])
    return int(sizes.sum())


def label_of(path: Path) -> bytes:
    """The ``cls`` field ``shardpipe pack --labels dirname`` gives this file (the class folder's index)."""
    return b"%d" % int(path.parent.name[1:])
