"""``python -m bench.transfer``: where a batch's cost goes between a DataLoader worker and the trainer.

Batches are made as shardpipe makes them (``loaders.batches.collate_samples`` over sample dicts: keys as a
list, ``bin`` and ``cls`` as ``RaggedBytes``, the pad flags as a small tensor), built once per worker and
yielded again and again, so only the transfer is timed. Transports, each through a real ``DataLoader``
(2 workers, prefetch 4, ``batch_size=None``, no conversion in the worker):

- ``pipe-64k``: the batch pickled into the worker's result pipe at the kernel's default pipe size;
- ``pipe-1m``: the same with the pipe enlarged to 1 MiB (``F_SETPIPE_SZ``), as ``make_loader`` does;
- ``ring``: the loaders' own shared-memory ring (``loaders.transfer.transport``: ``RingSender`` as the
  collate_fn, slots sized and counted as ``make_loader`` does, the 1 MiB pipe for the descriptors). The worker
  copies each field's bytes into its next free slot and sends a small descriptor through the pipe; the main
  process copies the bytes out while unpickling the descriptor and frees the slot;
- ``floor``: a one-sample, 16-byte batch through the 1 MiB pipe: the fixed per-batch cost of the DataLoader's
  task and result queues and process switches, which no transport of the bytes can remove.

End to end: batches/s in the main process after ``--warmup`` batches, runs of every transport interleaved and
rotated, ``--repeats`` times, medians reported with min-max. Components, timed in one process (median over
``--calls``): pickling a batch (``ForkingPickler.dumps``, what the worker's queue calls), unpickling it with
its tensor rebuilds (``pickle.loads``), and the ring's write, its copy-out, and (for comparison only) the
same read handing out views of the slot instead of copies. The main process's share is
unpickle (or copy-out) + waiting: when workers keep up, the end-to-end time per batch is the main's work.
"""

from __future__ import annotations

RULES = {
    "batches": "built once per worker (loaders.batches.collate_samples, sizes +-25% around the mean) and"
    " yielded again and again: only the transfer is timed",
    "loader": "a real DataLoader per run: --workers workers, prefetch 4, batch_size=None, no conversion",
    "warmup": "the first --warmup batches of each run are discarded (worker start, pipes filling)",
    "window": "batches/s = the run's remaining batches (--bytes-per-run of payload, at least 50) / their"
    " wall time in the main process",
    "repeats": "--repeats runs per transport, interleaved and rotated; median reported, min-max as spread",
    "x_pipe_1m": "median batches/s / the 1 MiB pipe's median batches/s at the same sample size",
    "components": "timed in one process, median over --calls calls: pickle (ForkingPickler.dumps), unpickle"
    " (pickle.loads with tensor rebuilds), the ring's write, its copy-out, and a read of views (comparison"
    " only)",
    "floor": "a one-sample, 16-byte batch through the 1 MiB pipe: the DataLoader's fixed per-batch cost",
}
