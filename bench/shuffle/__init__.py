"""``make bench-shuffle``: how well the loaders mix, measured on the orders the trainer receives.

Data: ``C`` classes x ``n`` small samples (label in a ``cls`` field), packed twice into tar shards of
``--shard-samples``: class-sorted (an ImageFolder tree in key order) and hash-ordered (see
``bench.shuffle.data``).
Contenders (``bench.shuffle.contenders``): shardpipe's defaults, the reference contiguous-window setting
(block 256, buffer 1024), a ``shuffle_buffer`` x ``block_size`` grid, webdataset ``.shuffle(n)`` on the same
shards, and a global permutation (``DistributedSampler`` over an LMDB copy) as the ideal; batch 64, 2 workers,
one rank. Each runs ``--epochs`` whole epochs through a real DataLoader; the keys received, in order, are
mapped to pack positions and scored (``bench.shuffle.metrics``) against the memory held (samples the shuffle
buffers per worker) and the read speed (warm cache, samples after ``--warmup`` batches over their time).
The read-speed target compares the defaults and the reference in ``--repeats`` interleaved, rotated runs of
at least ``--speed-samples`` samples each (whole epochs; timed samples over their time), medians of the runs,
so drift on a shared machine hits both alike; the grid's speeds are single runs, a rough guide only.
Absolute speeds compare only on like hardware. Quality does not depend on the machine (shardpipe's and the
ideal's orders are seeded), except webdataset's: its sample buffer is seeded from time and pid when no
generator is given, as users run it.
The ideal ``C(1-(1-1/C)^B)`` counts draws with replacement; a balanced finite set drawn without replacement
scores a little higher, so ratios slightly above 1 happen on tiny data.
"""

from __future__ import annotations

RULES = {
    "order": "the keys of every batch in the order the main process received them, over whole epochs",
    "classes": "mean distinct labels per full batch; ideal C(1-(1-1/C)^B)",
    "entropy": "mean label entropy (bits) per full batch; ideal: the same uniform draw, simulated (seeded)",
    "rho": "|Spearman| between output position and pack position, mean over epochs",
    "same_shard": "rate of consecutive samples from one shard / the uniform chance sum (n_s/N)^2 (~1/S)",
    "epoch_corr": "Pearson correlation of each sample's output position in consecutive epochs",
    "memory": "samples the shuffle holds per worker: shuffle_buffer (shardpipe), n (webdataset), 0 (random"
    " access)",
    "speed": "samples after the --warmup-th batch / their time, median over the epochs; warm page cache",
    "speed_target": "defaults vs reference (block 256, buffer 1024): --repeats interleaved, rotated runs of"
    " >= --speed-samples samples (whole epochs); median of the runs",
    "once": "each epoch checked to hold every sample exactly once",
}
