"""webdataset's ``ShardWriter`` packing a tree, as a user's script would: the pack benchmark's peer.

``python -m bench.pack.shardwriter TREE OUT MAXCOUNT`` runs it as its own process, start-up and the import
of webdataset (which imports torch) included, the way ``shardpipe pack`` and ``tar cf`` are timed; the
benchmark also calls :func:`pack_tree` in-process. Without ``--max-side`` this module imports nothing of
shardpipe or numpy, so the script pays only for what a ShardWriter user's script pays for.

With ``--max-side N --quality Q`` every file goes through ``ImagePreparation(N, Q).prepare`` first, the
function ``shardpipe pack --image-max-side`` applies, so the work per image is the same. That script is
webdataset's documented shape: one process, one loop that reads, transforms and writes. With ``--pool W``
a ``multiprocessing.Pool(W)`` prepares the files, in order, and the loop writes what it returns.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator

Prepare = Callable[[bytes], bytes]
_prepare: Prepare | None = None  # per pool worker, set by _init_worker


def pack_tree(
    tree: str, out: str, maxcount: int, prepare: tuple[int, int] | None = None, pool: int = 0
) -> None:
    """Write every file of ``tree`` as one sample (key = its path without extensions, field = its
    extensions: ``bin``, ``jpg``); ``prepare = (max_side, quality)`` shrinks each one first, in a pool
    of ``pool`` processes when ``pool`` > 0."""
    import webdataset as wds

    files = list(_files(tree))
    paths = [path for _, _, path in files]
    with contextlib.ExitStack() as stack:
        payloads: Iterable[bytes]
        if prepare is None:
            payloads = map(_read, paths)
        elif pool == 0:
            payloads = map(_preparation(*prepare), map(_read, paths))
        else:
            workers = multiprocessing.Pool(pool, initializer=_init_worker, initargs=prepare)
            stack.enter_context(workers)
            payloads = workers.imap(_prepare_file, paths, chunksize=16)  # in order, as the loop writes
        pattern = os.path.join(out, "shard-%06d.tar")
        sink = stack.enter_context(wds.ShardWriter(pattern, maxcount=maxcount, maxsize=1e15, verbose=0))
        for (key, field, _), data in zip(files, payloads, strict=True):
            sink.write({"__key__": key, field: data})


def _files(tree: str) -> Iterator[tuple[str, str, str]]:
    """``(key, field, path)`` of every file of ``tree``, folders and names sorted."""
    for dirpath, dirnames, names in os.walk(tree):
        dirnames.sort()
        rel = os.path.relpath(dirpath, tree)
        for name in sorted(names):
            stem, _, field = name.partition(".")
            yield f"{rel}/{stem}", field, os.path.join(dirpath, name)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _preparation(max_side: int, quality: int) -> Prepare:
    from shardpipe.packing.images import ImagePreparation

    return ImagePreparation(max_side, quality).prepare


def _init_worker(max_side: int, quality: int) -> None:
    global _prepare
    _prepare = _preparation(max_side, quality)


def _prepare_file(path: str) -> bytes:
    assert _prepare is not None, "the pool's initializer sets the function"
    return _prepare(_read(path))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.pack.shardwriter")
    parser.add_argument("tree")
    parser.add_argument("out")
    parser.add_argument("maxcount", type=int)
    parser.add_argument("--max-side", type=int, help="prepare every file: shrink to this longest side")
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--pool", type=int, default=0, help="processes that prepare the files (0: the loop)")
    args = parser.parse_args()
    prepare = None if args.max_side is None else (args.max_side, args.quality)
    pack_tree(args.tree, args.out, args.maxcount, prepare, args.pool)
