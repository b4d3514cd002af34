"""``make bench-scale``: what a plan costs each DataLoader worker as the epoch grows, from 10^6 to 10^10
samples: the plan alone (time to a worker's first window, peak traced memory), and a real ``Mixture``
end to end (time to the first batch, the worker's peak RSS).

Plan-only cases run in a fresh process each, on synthetic shard tables (shards of 10,000 samples): the
last worker of the last rank (8 workers a rank) computes the epoch's sequence and its first window, as a
worker does at the start of an epoch; a mixture also locates that window's samples in its sources. The
same plan in layout 2 (the materialising plan, kept for states saved before layout 3) runs where it fits
in time, and Grain's ``IndexSampler`` gives a single dataset's last worker as many indices as our first
window holds. MosaicML streaming is not run: installing it replaces the pinned CPU torch with a CUDA
build. Manifests of 10^4 to 10^6 shards are loaded cold, with the shards in a table file and (up to 10^5)
listed in the JSON.
"""

RULES = {
    "warm-up": "none: each case is one cold computation in a fresh process (a worker at its epoch's start)",
    "window": "plan-only: from the sequence's construction to the first window's rows and yield order; "
    "end to end: from iter(loader) to the first batch (the worker's start included: forked, as a "
    "training script's workers are on Linux), and again after set_epoch(1) in the same persistent worker",
    "memory": "plan-only: tracemalloc's peak during the computation (numpy's allocations included), the "
    "shard table built before it; end to end: the DataLoader worker's VmHWM",
    "repeats": "one run a case; the plan is deterministic, its time varies with the machine's load",
    "discard": "none",
}
