"""The pack stage: scan a source, plan its shards once, write them on an engine, commit the manifest.

:func:`pack` is the entry point; :mod:`.engine` says what an executor must honour, :mod:`.output` how OUT
is made ready, resumed and committed, :mod:`.plan` what goes in which shard; beside them, :mod:`.pack_source`
(``pack``'s flow, source to manifest), :mod:`.items` (``pack_items``: samples made from items) and
:mod:`.dataset_writer` (``DatasetWriter``: samples produced in Python), :mod:`.options` (a job's options and
their checks), :mod:`.split` (a sample's split, from seed and key), :mod:`.driver` (the driver's side: run,
journal, manifest), :mod:`.shard_writing` (writing one shard), :mod:`.ray_engine` (the Ray executor),
:mod:`.lifetime` (a worker ends when its driver dies), :mod:`.tally` (what the shard writers have written so
far, for the progress bar), :mod:`.transform` (what runs on every sample, and its identity in the job),
:mod:`.mapping` (packing with a transform, in two steps), :mod:`.samples` (samples in webdataset's convention,
and their checks), :mod:`.images` (image preparation: shrink, re-encode) and :mod:`.compressing` (compression
at pack time: which fields, their dictionaries, the manifest's record).
"""

from shardpipe.packing.driver import PackResult
from shardpipe.packing.options import PackOptions
from shardpipe.packing.pack_source import pack

__all__ = ["PackOptions", "PackResult", "pack"]
