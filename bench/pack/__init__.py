"""``make bench-pack``: ``shardpipe pack`` per format against ``tar cf`` and webdataset's ``ShardWriter``,
and preparing data while packing (a no-op ``--map``; ``--image-max-side``) against its limits.

The targets (issue 9, section 6) are ratios measured in one run on the same files, for 1 KiB (``small``)
and 64 KiB (``large``) samples: every format's CLI against ``tar cf`` (in its default, hashed, order, its
start-up included); shardpipe's tar against ``ShardWriter``, both run as processes; the same tar pack with
a no-op ``--map`` against the pack without it (a time ratio, at most). For photos (``images``: about
500x375 JPEGs, shrunk to a longest side of :data:`~bench.pack.contenders.IMAGE_MAX_SIDE`), shardpipe's CLI
against the bare pool and against the one-loop ``ShardWriter`` script. For a Parquet dataset in Hugging
Face's layout (``parquet``: rows of 1 KiB binary plus an int label, issue 34), shardpipe's CLI on the
folder against its CLI on the same rows as a flat Parquet list with a key column. Their thresholds are
defined once, in :mod:`bench.pack.targets`, and every report prints them. Ratios from one interleaved
run are what a noisy shared machine can compare honestly: every contender runs once per round, the order
rotates between rounds, and the median of ``--repeats`` rounds is reported with its min-max. Targets are
judged on the median of per-round ratios (:func:`bench.pack.run.paired_ratio`), which cancels the
machine's drift between rounds, and always like with like.

* The trees are built once and reused by fingerprint from ``bench-results/pack-cache/`` (git-ignored,
  :mod:`bench.pack.data`): for ``small`` and ``large`` one ``.bin`` file per sample in ten class folders,
  seeded random bytes; for ``images`` an ImageFolder tree of real photos (:mod:`testkit.photos`, nothing
  downloaded); for ``parquet`` the same rows as a Hugging Face-style folder and as a flat list.
* Each tree is read once before timing, so every contender reads it from the page cache: the benchmark
  measures the packers, not the disk. Outputs go to the same file system; ``os.sync()`` runs (untimed)
  before every run so one contender's write-back does not land in the next one's time.
* ``shardpipe pack`` runs as the CLI in a subprocess (start-up included, as a user sees it), and as
  ``shardpipe.pack`` in-process, the pack time alone (shown, not judged). It fsyncs each shard
  before publishing it (its crash safety); ``tar cf`` and ``ShardWriter`` do not, so that cost counts
  against shardpipe. The ``tar cf + fsync`` row shows what that durability costs tar itself.
* ``ShardWriter`` runs twice (:mod:`bench.pack.shardwriter`): as a script in its own process, start-up
  and the import of webdataset included, as a user runs it (the peer of the CLI rows, and of the target);
  and in-process, import excluded (the peer of ``pack()``, shown). Both walk the tree, read each file and
  write it, with ``maxcount`` equal to shardpipe's ``--max-samples``.
* ``images`` has its own contenders (:func:`bench.pack.contenders.image_contenders`), all applying the
  same function (``ImagePreparation(max_side, quality).prepare``) and all run as scripts except
  ``pack()``: the bare pool (:mod:`bench.pack.bare_pool`, the function plus file writes: the baseline, its
  processes set up as shardpipe's are so that it is the limit; beside it the same pool in plain
  processes), the one-loop ``ShardWriter`` script (webdataset's documented shape) and a ``ShardWriter`` fed
  by a pool. Each output is checked (:mod:`bench.pack.checks`): every photo under its key, decoding with
  its longest side ``max_side``.
* The CLI's start-up (a 3-file pack) is timed in the same run and reported beside the table. The
  project's bytecode is written first (``bench.common.system.compile_sources``), as an install writes it,
  so no fresh interpreter compiles the sources again, even where ``PYTHONDONTWRITEBYTECODE`` is set.

``python -m bench.pack [--quick] [--profile small,large,images,parquet] [--out DIR] [--docs PAGE]`` writes
``DIR/report.json`` and ``DIR/report.md``, and with ``--docs`` its section of ``PAGE``
(``bench.common.docs_page``). ``python -m bench.pack.ray`` compares the Ray engine with the local pool.

Worker processes and script contenders import modules of this package (:mod:`bench.pack.maps`,
:mod:`bench.pack.bare_pool`, :mod:`bench.pack.shardwriter`), so this file imports nothing.
"""
