"""Small synthetic sources for tests: trees of sample files with deterministic content."""

from __future__ import annotations

import hashlib
from pathlib import Path


def payload(key: str, field: str, size: int) -> bytes:
    """Deterministic bytes unique to (key, field)."""
    seed = hashlib.sha256(f"{key}.{field}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def make_tree(
    root: Path,
    num_samples: int,
    *,
    classes: int = 3,
    fields: tuple[str, ...] = ("bin", "txt"),
    size: int = 100,
) -> dict[str, dict[str, bytes]]:
    """Write ``cls{c}/{i:05d}.{field}`` files; return the expected samples keyed by key."""
    expected: dict[str, dict[str, bytes]] = {}
    for i in range(num_samples):
        key = f"cls{i % classes}/{i:05d}"
        (root / f"cls{i % classes}").mkdir(parents=True, exist_ok=True)
        expected[key] = {}
        for field in fields:
            data = payload(key, field, size + i % 7)
            (root / f"{key}.{field}").write_bytes(data)
            expected[key][field] = data
    return expected


def pack_dataset(
    root: Path,
    fmt: str,
    num_samples: int,
    *,
    max_samples: int = 7,
    split: str | None = None,
    order: str = "sorted",
    **tree: object,
) -> Path:
    """Pack a synthetic tree (``make_tree``) into ``root/<fmt>``; return the dataset folder.

    ``order="sorted"`` by default, unlike ``shardpipe pack``: the loader tests read packs whose order is
    the key order, so an unshuffled read can be checked against ``sorted(keys)``.
    """
    from shardpipe.packing import PackOptions, pack
    from shardpipe.packing.split import parse_split

    src = root / "src"
    if not src.exists():
        make_tree(src, num_samples, **tree)  # type: ignore[arg-type]
    out = root / fmt
    options = PackOptions(
        format=fmt, split=parse_split(split), order=order, max_samples=max_samples, labels="dirname"
    )
    pack(src, out, options, quiet=True)
    return out


def read_with_webdataset(urls: str | list[str]) -> list[tuple[str, dict[str, bytes]]]:
    """Every sample as webdataset's own pipeline reads it.

    webdataset leaves its tar files open; collecting them here keeps the ResourceWarning inside the calling
    test (whose mark ignores it) instead of surfacing whenever the garbage collector next runs.
    """
    import gc

    import webdataset as wds

    samples = [
        (s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")})
        for s in wds.WebDataset(urls, shardshuffle=False)
    ]
    gc.collect()
    return samples
