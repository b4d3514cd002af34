"""The pack stage: scan a source, plan its shards once, write them on an engine, commit the manifest.

:func:`pack` is the entry point; :mod:`.engine` says what an executor must honour, :mod:`.output` how OUT
is made ready, resumed and committed, :mod:`.plan` what goes in which shard.
"""

from shardpipe.packing.driver import PackResult
from shardpipe.packing.options import PackOptions
from shardpipe.packing.pack_source import pack

__all__ = ["PackOptions", "PackResult", "pack"]
