"""Reading a plan's samples: :mod:`.source` (where a dataset's files come from), :mod:`.readers` (the
open shard readers of one process), :mod:`.columns` (a window as columns, cut into samples or batches),
:mod:`.decode` (field decoders), :mod:`.windows` (a worker's planned windows read into columns, under
``on_error``), :mod:`.mixed` and :mod:`.mixed_landing` (a mixture's window read source by source and put back
in order, or landed in one copy), :mod:`.keys` (a sample found by its key), :mod:`.compression` (compressed
fields decoded on read), :mod:`.images`, :mod:`.image_boxes` and :mod:`.image_routes` (images decoded and
cropped into batches: the boxes and draws, the decoder each takes), :mod:`.device_crops` (crops finished on a
device) and :mod:`.nvimgcodec` (the optional nvImageCodec decoder)."""
