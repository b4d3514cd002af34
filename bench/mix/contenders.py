"""Every contender by name, each run for whole epochs at one simulated world size into a trace.

``shardpipe`` and ``shardpipe-per-batch``: ``loaders.Mixture`` (``bench.mix.mixture``) over each source's
own format; ``random-mix`` and ``weighted-draw``: the peers (``bench.mix.peers``). All see the same sources,
weights, seed, batch size and workers, and an epoch of the same number of samples (the sum of the sources'
sizes, the mixture's default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.mix import mixture, peers
from bench.mix.data import Source, weights
from bench.mix.trace import Shape, Trace

NAMES = ("shardpipe", "shardpipe-per-batch", "random-mix", "weighted-draw")


@dataclass(frozen=True, slots=True)
class Settings:
    batch_size: int
    num_workers: int
    epochs: int
    seed: int


def run(name: str, sources: Sequence[Source], world_size: int, s: Settings) -> Trace:
    """Contender ``name``'s ``s.epochs`` epochs on every rank of ``world_size``."""
    total = sum(src.spec.num_samples for src in sources)
    shape = Shape(world_size, s.num_workers, s.batch_size, total, s.epochs, s.seed)
    fractions = weights([src.spec for src in sources])
    if name in ("shardpipe", "shardpipe-per-batch"):
        return mixture.trace(sources, shape, per_batch=name == "shardpipe-per-batch")
    if name == "random-mix":
        return peers.random_mix([[str(p) for p in src.tar_shards] for src in sources], fractions, shape)
    if name == "weighted-draw":
        return peers.weighted_draw([src.spec.num_samples for src in sources], fractions, shape)
    raise ValueError(f"unknown contender {name!r}; choose one of {', '.join(NAMES)}")
