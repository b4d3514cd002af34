"""``make demo``: real small files -> shards in every format -> verified -> 2-rank DDP training on CPU.

Why this shape: it exercises the whole user path with nothing downloaded. scikit-learn bundles 1,797 8x8
handwritten digits; written as one PNG per sample in class folders they are the many-small-files case that
shardpipe exists for. Each format is packed, verified and inspected through the CLI exactly as a user would
type it, then ``torchrun`` trains on the chosen pack with 2 gloo ranks and checks the accuracy bar.

    python -m bench.demo [--out demo-out] [--epochs 10] [--format tar]

:mod:`bench.demo.data` writes the digits, :mod:`bench.demo.run` runs the CLI and torchrun,
:mod:`bench.demo.train` is the training script each rank runs.
"""
