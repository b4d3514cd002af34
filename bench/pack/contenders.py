"""What the pack benchmark times: each contender is a name, a kind and a function ``(tree, out) -> None``.

Byte profiles (:func:`contenders`): ``tar cf`` (the baseline) and ``tar cf`` + fsync; ``shardpipe pack``
per format as the CLI (a subprocess from the repository root, start-up included) and as ``pack()``
in-process; the tar pack with a no-op ``--map``; webdataset's ``ShardWriter`` in-process and as a script;
with ``--engine ray`` the Ray engine in-process. Photos (:func:`image_contenders`): every contender applies
the same preparation; the bare pool is the baseline. Parquet (:func:`parquet_contenders`): the CLI on a
Hugging Face-style folder against the CLI on a flat Parquet list of the same rows, the baseline.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.system import ROOT
from bench.pack.data import FLAT_LIST, HF_FOLDER, PhotoProfile
from bench.pack.shardwriter import pack_tree
from shardpipe import PackOptions, RayExecutor, pack
from shardpipe.packing.engine import init_worker

FORMATS = ("tar", "lmdb", "tfrecord")
TAR = "tar cf"
TAR_FSYNC = "tar cf + fsync"
SHARDWRITER = "webdataset ShardWriter (in-process)"
SHARDWRITER_SCRIPT = "webdataset ShardWriter (script)"
MAP_SPEC = "bench.pack.maps:unchanged"
MAP_NOOP = "shardpipe tar --map (no-op)"
IMAGE_MAX_SIDE, IMAGE_QUALITY = 256, 90
PREPARED = f"shardpipe tar --image-max-side {IMAGE_MAX_SIDE}"
PREPARED_IN_PROCESS = f"{PREPARED} (in-process)"
BARE_POOL = "bare pool (script)"
BARE_POOL_PLAIN = "bare pool, plain processes (script)"
SHARDWRITER_LOOP = "webdataset ShardWriter, one loop (script)"
SHARDWRITER_POOL = "webdataset ShardWriter fed by a pool (script)"
IMAGE_LAYOUTS = {  # what each images contender writes: bench.pack.checks.check_prepared reads it
    PREPARED: "shards",
    PREPARED_IN_PROCESS: "shards",
    BARE_POOL: "files",
    BARE_POOL_PLAIN: "files",
    SHARDWRITER_LOOP: "tars",
    SHARDWRITER_POOL: "tars",
}
RAY = "shardpipe tar on Ray (in-process)"
HF_PARQUET = "shardpipe tar (Hugging Face Parquet folder)"
FLAT_PARQUET = "shardpipe tar (flat Parquet list)"
ENGINES: list[Any] = []  # executors started for contenders; shut down when the benchmark ends


@dataclass(frozen=True, slots=True)
class Contender:
    name: str
    kind: str  # baseline | cli | in-process | reference
    run: Callable[[Path, Path], None]  # (tree, output folder) -> None; raises on failure


def _tar_cf(tree: Path, out: Path) -> None:
    subprocess.run(["tar", "cf", str(out / "all.tar"), "-C", str(tree), "."], check=True)


def _tar_cf_fsync(tree: Path, out: Path) -> None:
    """``tar cf`` made as durable as shardpipe's fsynced shards: the floor for a durable packer."""
    _tar_cf(tree, out)
    fd = os.open(out / "all.tar", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def shardpipe_cli(
    fmt: str, workers: int, max_samples: int, *flags: str, source: str = ""
) -> Callable[[Path, Path], None]:
    """``shardpipe pack`` as a user types it, run from the repository root (where ``bench`` imports);
    ``source``: what it packs, relative to the profile's tree (default: the tree)."""

    def run(tree: Path, out: Path) -> None:
        command = [
            sys.executable, "-m", "shardpipe", "pack", str(tree / source), str(out / "ds"), "--format", fmt,
            "--workers", str(workers), "--max-bytes", "none", "--max-samples", str(max_samples), "--quiet",
            *flags,
        ]  # fmt: skip
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)

    return run


def _in_process(fmt: str, workers: int, max_samples: int, **extra: Any) -> Callable[[Path, Path], None]:
    options = PackOptions(format=fmt, max_samples=max_samples, max_bytes=None, workers=workers, **extra)

    def run(tree: Path, out: Path) -> None:
        pack(tree, out / "ds", options, quiet=True)

    return run


def _on_ray(workers: int, max_samples: int) -> Callable[[Path, Path], None]:
    """``pack()`` with the Ray engine; Ray is started once, before timing (its start-up is reported by
    ``python -m bench.pack.ray``, which also measures the per-task cost and the listing rate)."""
    executor = RayExecutor(max_workers=workers, initializer=init_worker)
    ENGINES.append(executor)
    options = PackOptions(format="tar", max_samples=max_samples, max_bytes=None, workers=workers)

    def run(tree: Path, out: Path) -> None:
        pack(tree, out / "ds", options, quiet=True, executor=executor)

    return run


def _shardwriter(max_samples: int) -> Callable[[Path, Path], None]:
    import webdataset  # noqa: F401 - imported before timing: the in-process row excludes its import

    def run(tree: Path, out: Path) -> None:
        pack_tree(str(tree), str(out), max_samples)

    return run


def _script(module: str, *args: str) -> Callable[[Path, Path], None]:
    """``python -m module TREE OUT *args`` in its own process, from the repository root."""

    def run(tree: Path, out: Path) -> None:
        subprocess.run([sys.executable, "-m", module, str(tree), str(out), *args], check=True, cwd=ROOT)

    return run


def _shardwriter_script(max_samples: int, *flags: str) -> Callable[[Path, Path], None]:
    return _script("bench.pack.shardwriter", str(max_samples), *flags)


def contenders(workers: int, max_samples: int, engine: str = "local") -> list[Contender]:
    found = [Contender(TAR, "baseline", _tar_cf), Contender(TAR_FSYNC, "reference", _tar_cf_fsync)]
    found += [Contender(f"shardpipe {f}", "cli", shardpipe_cli(f, workers, max_samples)) for f in FORMATS]
    found += [
        Contender(f"shardpipe {f} (in-process)", "in-process", _in_process(f, workers, max_samples))
        for f in FORMATS
    ]
    found.append(Contender(MAP_NOOP, "cli", shardpipe_cli("tar", workers, max_samples, "--map", MAP_SPEC)))
    found.append(Contender(SHARDWRITER, "reference", _shardwriter(max_samples)))
    found.append(Contender(SHARDWRITER_SCRIPT, "reference", _shardwriter_script(max_samples)))
    if engine == "ray":
        found.append(Contender(RAY, "in-process", _on_ray(workers, max_samples)))
    return found


def image_contenders(workers: int, max_samples: int, photos: PhotoProfile) -> list[Contender]:
    """The images profile: every contender prepares every photo with the same function, ``workers``
    processes wide except the one-loop ShardWriter script (one process, as webdataset's docs show it)."""
    side, quality = str(photos.max_side), str(photos.quality)
    prepare = ("--max-side", side, "--quality", quality)
    flags = ("--image-max-side", side, "--image-quality", quality)
    options = {"image_max_side": photos.max_side, "image_quality": photos.quality}
    pool = ("--pool", str(workers))
    bare = (*prepare, "--workers", str(workers))
    return [
        Contender(BARE_POOL, "baseline", _script("bench.pack.bare_pool", *bare, "--pack-settings")),
        Contender(BARE_POOL_PLAIN, "reference", _script("bench.pack.bare_pool", *bare)),
        Contender(PREPARED, "cli", shardpipe_cli("tar", workers, max_samples, *flags)),
        Contender(PREPARED_IN_PROCESS, "in-process", _in_process("tar", workers, max_samples, **options)),
        Contender(SHARDWRITER_LOOP, "reference", _shardwriter_script(max_samples, *prepare)),
        Contender(SHARDWRITER_POOL, "reference", _shardwriter_script(max_samples, *prepare, *pool)),
    ]


def parquet_contenders(workers: int, max_samples: int) -> list[Contender]:
    """The parquet profile: the same rows packed by the CLI from a flat Parquet list with a key column (the
    baseline) and from a folder in Hugging Face's layout (:func:`bench.pack.data.build_parquet`)."""
    return [
        Contender(FLAT_PARQUET, "baseline", shardpipe_cli("tar", workers, max_samples, source=FLAT_LIST)),
        Contender(HF_PARQUET, "cli", shardpipe_cli("tar", workers, max_samples, source=HF_FOLDER)),
    ]
