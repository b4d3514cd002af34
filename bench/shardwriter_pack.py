"""webdataset's ``ShardWriter`` packing a tree, as a user's script would: the pack benchmark's peer.

``python -m bench.shardwriter_pack TREE OUT MAXCOUNT`` runs it as its own process, start-up and the import
of webdataset (which imports torch) included, the way ``shardpipe pack`` and ``tar cf`` are timed; the
benchmark also calls :func:`pack_tree` in-process. This module imports nothing of shardpipe or numpy, so
the script pays only for what a ShardWriter user's script pays for.
"""

from __future__ import annotations

import os
import sys


def pack_tree(tree: str, out: str, maxcount: int) -> None:
    """Write every file of ``tree`` as one sample (key = its path without extensions, field ``bin``)."""
    import webdataset as wds

    pattern = os.path.join(out, "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=maxcount, maxsize=1e15, verbose=0) as sink:
        for dirpath, dirnames, names in os.walk(tree):
            dirnames.sort()
            rel = os.path.relpath(dirpath, tree)
            for name in sorted(names):
                with open(os.path.join(dirpath, name), "rb") as f:
                    data = f.read()
                sink.write({"__key__": f"{rel}/{name.partition('.')[0]}", "bin": data})


if __name__ == "__main__":
    tree, out, maxcount = sys.argv[1:]
    pack_tree(tree, out, int(maxcount))
