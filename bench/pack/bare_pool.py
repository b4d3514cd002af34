"""The bare pool: the limit the ``images`` profile measures shardpipe's preparing pack against.

:func:`prepare_tree` is ``multiprocessing.Pool(workers)`` applying ``ImagePreparation(max_side,
quality).prepare`` to every file and writing each result as a file, with nothing else around it (no
listing beyond ``os.walk``, no framing, no shards, no fsync). With ``pack_settings`` its processes are set
up as shardpipe's pack processes are (numpy's OpenBLAS without threads,
:func:`shardpipe.packing.engine.init_worker`: glibc keeps freed memory, the cyclic GC paused), so it is the
limit of parallel preparation on a machine: the function itself plus the file reads and writes. Without
them it is the pool as a user writes it, whose decode buffers (larger than glibc's mmap threshold) are
mapped and page-faulted in afresh for every image.

``python -m bench.pack.bare_pool TREE OUT --max-side N --quality Q --workers W [--pack-settings]`` runs it
as its own process, start-up included, the way the CLI rows are timed.

Workers import this module (the pool's task), so it imports only the standard library at the top;
shardpipe loads inside the functions that need it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator

POOL_CHUNK = 16  # files per pool task: few enough round trips that the pool's own cost stays out of sight

_prepare: Callable[[bytes], bytes] | None = None  # per pool worker, set by _init_worker


def relpaths(tree: str) -> Iterator[str]:
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

    pairs = [(os.path.join(tree, rel), os.path.join(out, rel)) for rel in relpaths(tree)]
    for folder in sorted({os.path.dirname(target) for _, target in pairs}):
        os.makedirs(folder, exist_ok=True)
    setup = (max_side, quality, pack_settings)
    with multiprocessing.Pool(workers, initializer=_init_worker, initargs=setup) as pool:
        for _ in pool.imap_unordered(_prepare_file, pairs, chunksize=POOL_CHUNK):
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pack.bare_pool", description="The bare pool: prepare every file of TREE."
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
