"""shardpipe: pack many small sample files into tar, LMDB or TFRecord shards with a manifest, and check them.

The public API is these names (``__all__``); every other module path may change::

    from shardpipe import pack, PackOptions, PackResult, pack_items, DatasetWriter, RayExecutor
    from shardpipe import verify, inspect, index, get
    from shardpipe import load_manifest, Manifest, ShardEntry
    from shardpipe import open_store, Store, RetryPolicy, StorageError
    from shardpipe import ShardpipeError, UsageError, DataError, CorruptShardError
    from shardpipe import SampleIndexError, SampleKeyError
    from shardpipe import __version__

The functions are named after the CLI's verbs (``shardpipe pack``, ``verify``, ``inspect``, ``index``).
``inspect`` is the standard library's module's name too: call it as ``shardpipe.inspect`` where both are
used. Its old name ``summarize``, and ``index_folder`` for ``index``, still work until 0.2, with a
``DeprecationWarning``.

Names load on first use: ``import loaders`` (which reads shards through :mod:`shardpipe.formats`) does not
load the pack stage, and the ``shardpipe`` command sets its process up before numpy loads.

Inside: :mod:`.packing` (the pack stage), :mod:`.sources` (what a pack reads: a tree, a file list or a
Parquet dataset), :mod:`.tools` (verify, index, inspect) and :mod:`.cli` (the ``shardpipe`` command);
:mod:`.manifest` (the contract between the pack stage and the loaders; its JSON read field by field in
:mod:`.manifest_json`) and :mod:`.shardtable` (a split's shard table, as Arrow columns), :mod:`.formats`
(the shard formats), :mod:`.storage` (a local folder or an object-store prefix, behind one interface),
:mod:`.errors` (the project's exception types), :mod:`.units` (sizes as people write them),
:mod:`.progress` (progress on long work, on a terminal or in logs), :mod:`.process_settings` (settings a
pack process applies to itself for speed) and :mod:`.version` (the package version, in one place).
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from shardpipe.version import __version__

if TYPE_CHECKING:
    from loaders.random_access import get
    from shardpipe.errors import (
        CorruptShardError,
        DataError,
        SampleIndexError,
        SampleKeyError,
        ShardpipeError,
        UsageError,
    )
    from shardpipe.manifest import Manifest, load_manifest
    from shardpipe.packing import PackOptions, PackResult, pack
    from shardpipe.packing.dataset_writer import DatasetWriter
    from shardpipe.packing.items import pack_items
    from shardpipe.packing.ray_engine import RayExecutor
    from shardpipe.shardtable import ShardEntry
    from shardpipe.storage import RetryPolicy, StorageError, Store, open_store
    from shardpipe.tools.index import index
    from shardpipe.tools.inspection import inspect
    from shardpipe.tools.verify import verify

_PUBLIC = {
    "CorruptShardError": "shardpipe.errors",
    "DataError": "shardpipe.errors",
    "SampleIndexError": "shardpipe.errors",
    "SampleKeyError": "shardpipe.errors",
    "ShardpipeError": "shardpipe.errors",
    "UsageError": "shardpipe.errors",
    "Manifest": "shardpipe.manifest",
    "ShardEntry": "shardpipe.shardtable",
    "load_manifest": "shardpipe.manifest",
    "PackOptions": "shardpipe.packing",
    "PackResult": "shardpipe.packing",
    "pack": "shardpipe.packing",
    "pack_items": "shardpipe.packing.items",
    "DatasetWriter": "shardpipe.packing.dataset_writer",
    "RayExecutor": "shardpipe.packing.ray_engine",
    "RetryPolicy": "shardpipe.storage",
    "StorageError": "shardpipe.storage",
    "Store": "shardpipe.storage",
    "open_store": "shardpipe.storage",
    "get": "loaders.random_access",  # reads through the loaders (torch), imported on first use
    "index": "shardpipe.tools.index",
    "inspect": "shardpipe.tools.inspection",
    "verify": "shardpipe.tools.verify",
}
_DEPRECATED = {"summarize": "inspect", "index_folder": "index"}
"""Old names, kept until 0.2: each warns and gives the object of its new name."""
__all__ = [
    "CorruptShardError",
    "DataError",
    "DatasetWriter",
    "Manifest",
    "PackOptions",
    "PackResult",
    "RayExecutor",
    "RetryPolicy",
    "SampleIndexError",
    "SampleKeyError",
    "ShardEntry",
    "ShardpipeError",
    "StorageError",
    "Store",
    "UsageError",
    "__version__",
    "get",
    "index",
    "inspect",
    "load_manifest",
    "open_store",
    "pack",
    "pack_items",
    "verify",
]


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        new = _DEPRECATED[name]
        warnings.warn(
            f"shardpipe.{name} is deprecated and goes in 0.2: use shardpipe.{new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return __getattr__(new)  # never cached: every use of the old name warns
    if name not in _PUBLIC:
        raise AttributeError(f"module 'shardpipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return __all__
