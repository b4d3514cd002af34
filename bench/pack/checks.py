"""Untimed checks that a contender packed every sample: a fast wrong packer would win otherwise.

Byte and Parquet profiles: shardpipe's manifest counts every sample, a tar holds at least every payload
and its headers. Photos: every photo of the tree is in the output under its key, decodes, and has its
longest side ``max_side``.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

from bench.pack.bare_pool import relpaths
from bench.pack.contenders import Contender
from bench.pack.data import ParquetProfile, PhotoProfile, Profile


def check_output(contender: Contender, out: Path, profile: Profile | ParquetProfile) -> None:
    """The contender's output holds every sample of ``profile``; raises RuntimeError if not."""
    if contender.name.startswith("shardpipe"):
        count = manifest_count(out / "ds")
        got = f"{count} samples"
        ok = count == profile.num_samples
    else:
        size = sum(p.stat().st_size for p in out.glob("*.tar"))
        got = f"{size} bytes of tar"
        ok = size >= profile.payload_bytes + 512 * profile.num_samples
    if not ok:
        raise RuntimeError(
            f"{contender.name} on {profile.name}: expected {profile.num_samples} samples, {got}"
        )


def manifest_count(dataset: Path) -> int:
    """The samples a shardpipe manifest counts, over every split."""
    manifest = json.loads((dataset / "manifest.json").read_text())
    return sum(s["samples"] for split in manifest["splits"].values() for s in split["shards"])


def check_prepared(layout: str, out: Path, tree: Path, profile: PhotoProfile) -> None:
    """Every photo of ``tree`` is in ``out`` under its key, decodes, and has its longest side
    ``max_side``. ``layout`` is ``shards`` (shardpipe: ``out/ds`` with a manifest), ``tars`` (ShardWriter:
    ``out/*.tar``) or ``files`` (the bare pool: the tree's paths under ``out``)."""
    expected = {rel.rpartition(".")[0] for rel in relpaths(str(tree))}
    images: Iterator[tuple[str, bytes]]
    if layout == "files":
        images = ((rel.rpartition(".")[0], (out / rel).read_bytes()) for rel in relpaths(str(out)))
    elif layout in ("shards", "tars"):
        images = _tar_images(sorted((out / "ds" if layout == "shards" else out).rglob("*.tar")))
    else:
        raise ValueError(f"layout must be shards, tars or files, got {layout!r}")
    if layout == "shards":
        count = manifest_count(out / "ds")
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
