"""Reading a plan's samples: :mod:`.source` (where a dataset's files come from), :mod:`.readers` (the
open shard readers of one process), :mod:`.columns` (a window as columns, cut into samples or batches),
:mod:`.decode` (field decoders), :mod:`.windows` (a worker's planned windows read into columns, under
``on_error``), :mod:`.repair` (a window's bad samples found and replaced under ``on_error="skip"``),
:mod:`.mixed` and :mod:`.mixed_landing` (a mixture's window read source by source and put back in order,
or landed in one copy), :mod:`.keys` (a sample found by its key) and :mod:`.compression` (compressed
fields decoded on read). Images are decoded and cropped in :mod:`loaders.images`."""
