"""``make bench-mix``: what a mixture of three datasets delivers, against the peers' ways of mixing.

Sources (``bench.mix.data``): three datasets of different sizes and formats (tar, LMDB, TFRecord), mixed at
fixed weights, batch 64, 2 workers. Contenders: shardpipe's ``Mixture`` (its default schedule, and
``per_batch=True``), webdataset's ``RandomMix`` over tar copies of the same sources, and a seeded
per-sample weighted draw (``bench.mix.peers``: how HF ``interleave_datasets``, LitData and torchdata pick
each sample's source). Each is run for whole epochs at every simulated world size, every rank planned in
turn (``RANK``/``WORLD_SIZE`` set, or ``rank=``/``world_size=`` given), and scored on the source of every
sample it yields (``bench.mix.metrics``): the composition error per batch, rank share, worker part,
shuffle window and epoch, and the repeats of a source's sample before that source was covered.

Composition does not depend on the bytes of a sample, only on the sources' sizes and shard layout, so it
is measured on count twins: the same sample counts and shards with tiny payloads. The speed run reads the
full-size sources, and its first epoch's source sequence is checked against the twins' (the same seed,
world and workers must give the same sequence), so the twins stand for the real data by a check, not by
assumption. Speed (``bench.mix.speed``): the mixture's epoch against the same three sources read one after
another, each for as many samples as the mixture takes of it, in rotated rounds; each loader for two such
passes, a fresh loader's first epoch and its next.
"""

from __future__ import annotations

RULES = {
    "composition": "for a run of n samples (pads excluded), the largest |count of a source - weight x n| "
    "over the sources; the value is the largest over every such run of the kind, every epoch and world",
    "batch": "each batch a rank receives",
    "rank share": "everything one rank receives in an epoch",
    "worker part": "a rank's batches j = k mod workers (the DataLoader takes batch j from worker j mod "
    "workers)",
    "shuffle window": "consecutive runs of --window samples of one worker part, from its start",
    "epoch": "everything every rank receives in an epoch",
    "repeats": "per source, at each epoch's end, the yields beyond what walking whole passes allows (every "
    "sample yielded k or k+1 times so far): the sum over its samples of max(0, count - least count - 1), the "
    "most over the epoch ends; it needs no order within an epoch; judged",
    "repeats in training order": "the same count after every step instead of every epoch (every rank's "
    "batch of a step together), the most over the steps; not judged: where a worker's part, or a rank's "
    "share, begins a source's new pass while another still ends the old one, the steps deliver both "
    "together, so this counts how the epoch is cut over workers and ranks",
    "peers": "random-mix: webdataset RandomMix, seeded through each rank's DataLoader generator (torch seeds "
    "Python's random, which RandomMix draws from, in each worker; one seed per rank), shards reshuffled per "
    "pass (detshuffle), sample buffers seeded, every source repeated; weighted-draw: numpy draws, "
    "independent per (epoch, rank, worker), each source restarted every epoch: the best case of random draws",
    "twins": "composition is measured on count twins of the sources (same counts and shards, tiny "
    "payloads); the full-size speed run's first-epoch source sequence is compared with the twins'",
    "speed": "samples over their time: the mixture's epoch against the three sources read one after another, "
    "each for its count in the mixture's epoch; warm page cache; each loader timed for two such passes: a "
    "fresh loader's first epoch from its --warmup-th batch (it also fills the loader's shared memory and "
    "buffer pools), then the same loader's next epoch (the rate of a long run)",
    "rounds": "mixture and sources-alone alternate, the order rotated each round; the target is the median "
    "over rounds of their ratio within the round (paired), with the min-max spread",
}
