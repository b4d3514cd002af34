"""shardpipe: pack many small sample files into tar, LMDB or TFRecord shards with a manifest, and check them.

The public API (everything else is a private module path)::

    from shardpipe import pack, PackOptions, verify, summarize, index_folder, load_manifest
    from shardpipe import DatasetWriter, pack_items

Names load on first use: ``import loaders`` (which reads shards through :mod:`shardpipe.formats`) does not
load the pack stage, and the ``shardpipe`` command sets its process up before numpy loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardpipe.version import __version__

if TYPE_CHECKING:
    from shardpipe.errors import CorruptShardError, DataError, ShardpipeError, UsageError
    from shardpipe.manifest import Manifest, ShardEntry, load_manifest
    from shardpipe.packing import PackOptions, PackResult, pack
    from shardpipe.packing.dataset_writer import DatasetWriter
    from shardpipe.packing.items import pack_items
    from shardpipe.packing.ray_engine import RayExecutor
    from shardpipe.storage import RetryPolicy, StorageError, Store, open_store
    from shardpipe.tools.index import index_folder
    from shardpipe.tools.inspection import summarize
    from shardpipe.tools.verify import verify

_PUBLIC = {
    "CorruptShardError": "shardpipe.errors",
    "DataError": "shardpipe.errors",
    "ShardpipeError": "shardpipe.errors",
    "UsageError": "shardpipe.errors",
    "Manifest": "shardpipe.manifest",
    "ShardEntry": "shardpipe.manifest",
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
    "index_folder": "shardpipe.tools.index",
    "summarize": "shardpipe.tools.inspection",
    "verify": "shardpipe.tools.verify",
}
__all__ = [
    "CorruptShardError",
    "DataError",
    "DatasetWriter",
    "Manifest",
    "PackOptions",
    "PackResult",
    "RayExecutor",
    "RetryPolicy",
    "ShardEntry",
    "ShardpipeError",
    "StorageError",
    "Store",
    "UsageError",
    "__version__",
    "index_folder",
    "load_manifest",
    "open_store",
    "pack",
    "pack_items",
    "summarize",
    "verify",
]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'shardpipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return __all__
