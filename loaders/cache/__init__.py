"""The per-node cache of remote shards: :mod:`.shard_cache` (verified local copies, prefetch by the
plan), :mod:`.directory` (its on-disk protocol, locks and byte budget), :mod:`.plans` (every reader's plan
on the node, for eviction)."""

from loaders.cache.shard_cache import DEFAULT_PREFETCH, ShardCache, ShardRef

__all__ = ["DEFAULT_PREFETCH", "ShardCache", "ShardRef"]
