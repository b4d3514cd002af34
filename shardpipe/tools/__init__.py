"""Tools over a packed dataset: :mod:`.verify` (check every claim), :mod:`.index` (adopt foreign
shards), :mod:`.inspection` (summarise)."""
