"""Images decoded and cropped into batches, beside reading: :mod:`.crops` (``RandomResizedCrop`` and
``CenterCrop``, column decoders that crop while they decode), :mod:`.boxes` (the crop boxes and their
seeded draws, pure), :mod:`.routes` (the decoder each image takes: nvImageCodec's region decode, or
Pillow's DCT-scaled one), :mod:`.device_crops` (crops finished on a device, in the trainer) and
:mod:`.nvimgcodec` (the optional nvImageCodec decoder)."""
