"""Mixing defaults that depend on how a dataset was packed, and the warning when mixing will be poor.

A DataLoader batch comes from one worker's window, so it mixes only the classes that the window's blocks
hold: a hashed pack (``shardpipe pack``'s default) is mixed already, a sorted pack needs small blocks.
"""

from __future__ import annotations

import logging
from typing import Any

from loaders.planning.planner import DEFAULT_BLOCK_SIZE
from shardpipe.manifest import Manifest

log = logging.getLogger("loaders")

HASHED_BLOCK_SIZE = 64
"""Blocks on a hashed pack: its samples are mixed already, so long reads cost nothing in mixing."""


def default_block_size(manifest: Manifest) -> int:
    return HASHED_BLOCK_SIZE if manifest.order.get("method") == "hashed" else DEFAULT_BLOCK_SIZE


MIN_BLOCKS_PER_WINDOW = 64
"""Fewer blocks than this per window leave a batch of a class-sorted pack few classes to draw from."""
_warned_mixing: set[str] = set()


def warn_if_poorly_mixed(manifest: Manifest, options: Any, where: object) -> None:
    """Warn once per dataset when a sorted pack of labelled data is read with windows too coarse to mix;
    ``options`` are the dataset's ``ReadOptions``."""
    blocks = options.shuffle_buffer // options.block_size
    sorted_pack = manifest.order.get("method", "sorted") == "sorted"  # packs before --order were sorted
    if not options.shuffle or manifest.classes is None or not sorted_pack or blocks >= MIN_BLOCKS_PER_WINDOW:
        return
    if manifest.fingerprint() in _warned_mixing:
        return
    _warned_mixing.add(manifest.fingerprint())
    fixes = [f"shuffle_buffer >= {MIN_BLOCKS_PER_WINDOW * options.block_size}"]
    largest_block = max(options.shuffle_buffer // MIN_BLOCKS_PER_WINDOW, 1)
    if options.block_size > largest_block:  # only then does a smaller block help
        fixes.insert(0, f"block_size <= {largest_block}")
    log.warning(
        "%s is packed in key order (labelled, %d classes) and each shuffle window holds only %d blocks "
        "(shuffle_buffer=%d / block_size=%d): batches will hold few classes. Use %s, or repack with "
        "`shardpipe pack --order hashed`",
        where,
        len(manifest.classes),
        blocks,
        options.shuffle_buffer,
        options.block_size,
        " or ".join(fixes),
    )
