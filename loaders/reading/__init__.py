"""Reading a plan's samples: :mod:`.source` (where a dataset's files come from), :mod:`.readers` (the
open shard readers of one process), :mod:`.columns` (a window as columns, cut into samples or batches),
:mod:`.decode` (field decoders)."""
