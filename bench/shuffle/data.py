"""The shuffle benchmark's data: one class-labelled tree packed class-sorted and hash-ordered, cached.

The tree is ImageFolder style (``cNNN/NNNNNN.bin``, the label from the class folder), so packed in key order
each shard holds one or two classes: the layout users actually have. The hashed pack holds the same samples
in a seeded hash order of their keys (``shardpipe pack --order hashed``, the default). Both are tar packs
(webdataset reads the same shards).

For each pack we record, by pack position (shard by shard, in manifest order), the key, label and shard
(read back with ``tarfile``, independently of shardpipe's reader), and write an ``lmdb-loop`` copy whose
index is the pack position, read by the global-permutation contender. Everything is rebuilt only when the
profile's fingerprint or shardpipe's packing code changes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench.io import lmdb_loop
from bench.io.data import packer_fingerprint
from shardpipe import PackOptions, pack
from shardpipe.manifest import load_manifest
from shardpipe.sources.tree import split_key

DATA_VERSION = 2
PACKS = ("sorted", "hashed")


@dataclass(frozen=True, slots=True)
class Profile:
    num_classes: int
    per_class: int
    shard_samples: int  # --max-samples: enough shards that "same shard" is a rare event
    sample_bytes: int = 1024
    seed: int = 0  # of the contents and of the hash order

    def __post_init__(self) -> None:
        if self.num_classes < 2 or self.per_class < 1 or self.shard_samples < 1 or self.sample_bytes < 16:
            raise ValueError(f"need >= 2 classes, >= 1 sample per class and shard, >= 16 B, got {self}")

    @property
    def num_samples(self) -> int:
        return self.num_classes * self.per_class

    @property
    def fingerprint(self) -> str:
        text = json.dumps({**asdict(self), "version": DATA_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Pack:
    """One packed copy and what each pack position holds."""

    name: str
    path: Path
    lmdb: Path
    keys: list[str]
    labels: np.ndarray  # (N,) int64 class index per pack position
    shards: np.ndarray  # (N,) int64 shard index per pack position
    shard_sizes: list[int]
    shard_files: list[Path]

    def position_of(self) -> dict[str, int]:
        return {key: i for i, key in enumerate(self.keys)}


def prepare(profile: Profile, cache: Path, *, log: bool = True) -> dict[str, Pack]:
    """Both packs of ``profile`` under ``cache``, built if their fingerprint (or the packer) changed."""
    root = Path(cache) / f"shuffle-{profile.fingerprint}"
    packer = packer_fingerprint()
    ready = root / "ready.json"
    if not (ready.exists() and json.loads(ready.read_text()).get("packer") == packer):
        shutil.rmtree(root, ignore_errors=True)
        if log:
            print(f"building shuffle data: {profile.num_classes} classes x {profile.per_class} samples")
        _write_tree(profile, root / "files")
        for name in PACKS:
            _pack(profile, root, name)
            _index(root / name, root / f"{name}-lmdb")
        ready.write_text(json.dumps({"profile": asdict(profile), "packer": packer}))
    return {name: _load(root, name) for name in PACKS}


def _write_tree(profile: Profile, tree: Path) -> None:
    rng = np.random.default_rng([DATA_VERSION, profile.seed])
    low, high = profile.sample_bytes * 3 // 4, profile.sample_bytes * 5 // 4
    sizes = rng.integers(low, high + 1, size=profile.num_samples)
    pool = rng.integers(0, 256, size=high * 8, dtype=np.uint8).tobytes()
    for c in range(profile.num_classes):
        folder = tree / f"c{c:03d}"
        folder.mkdir(parents=True)
        for j in range(profile.per_class):
            i = c * profile.per_class + j
            start = (i * 7919) % (len(pool) - high)
            (folder / f"{j:06d}.bin").write_bytes(pool[start : start + int(sizes[i])])


def _pack(profile: Profile, root: Path, name: str) -> None:
    options = PackOptions(
        format="tar",
        max_samples=profile.shard_samples,
        max_bytes=None,
        workers=2,
        order=name,
        labels="dirname",
    )
    pack(root / "files", root / name, options, quiet=True)


def _index(pack_path: Path, lmdb_path: Path) -> None:
    """Read the pack back in pack order (tarfile, not shardpipe): key, label, shard per position; write
    the lmdb-loop copy indexed by pack position."""
    entries = load_manifest(pack_path).split_shards("train")
    keys: list[str] = []
    labels: list[int] = []
    shards: list[int] = []
    samples: list[tuple[str, bytes, bytes]] = []
    for shard_index, entry in enumerate(entries):
        grouped: dict[str, dict[str, bytes]] = {}
        with tarfile.open(pack_path / entry.path) as tar:
            for member in tar:
                split = split_key(member.name)
                file = tar.extractfile(member)
                if split is None or file is None:
                    continue
                grouped.setdefault(split[0], {})[split[1]] = file.read()
        if len(grouped) != entry.num_samples:
            raise RuntimeError(
                f"{entry.path}: {len(grouped)} samples read, the manifest says {entry.num_samples}"
            )
        for key, fields in grouped.items():  # insertion order = order in the tar
            keys.append(key)
            labels.append(int(fields["cls"]))
            shards.append(shard_index)
            samples.append((key, fields["cls"], fields["bin"]))
    lmdb_loop.write(lmdb_path, samples, sum(len(s[2]) for s in samples))
    table = {
        "keys": keys,
        "labels": labels,
        "shards": shards,
        "shard_sizes": [e.num_samples for e in entries],
    }
    (pack_path.parent / f"{pack_path.name}-table.json").write_text(json.dumps(table))


def _load(root: Path, name: str) -> Pack:
    table = json.loads((root / f"{name}-table.json").read_text())
    entries = load_manifest(root / name).split_shards("train")
    return Pack(
        name=name,
        path=root / name,
        lmdb=root / f"{name}-lmdb",
        keys=table["keys"],
        labels=np.asarray(table["labels"], dtype=np.int64),
        shards=np.asarray(table["shards"], dtype=np.int64),
        shard_sizes=table["shard_sizes"],
        shard_files=[root / name / e.path for e in entries],
    )
