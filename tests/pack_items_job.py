"""``pack_items`` as a process of its own, for the tests that kill it: ``python -m tests.pack_items_job OUT
START_METHOD NUM_ITEMS [--resume]`` packs ``tests.maps.slow_item`` over ``range(NUM_ITEMS)`` on two
workers started by START_METHOD (fork, spawn or forkserver)."""

from __future__ import annotations

import multiprocessing
import sys

from shardpipe import PackOptions, pack_items

if __name__ == "__main__":
    out, method, num_items, *flags = sys.argv[1:]
    multiprocessing.set_start_method(method)
    options = PackOptions(format="tar", max_samples=5, workers=2, resume="--resume" in flags)
    pack_items(range(int(num_items)), "tests.maps:slow_item", out, options, quiet=True)
