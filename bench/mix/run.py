"""The benchmark's two measurements: every contender's composition and repeats at every world size (on
the count twins), and the read-speed rounds of the mixture against the sources alone (full size)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench.mix import contenders, metrics, mixture
from bench.mix.data import Source, weights
from bench.mix.speed import PASSES, Timing, rotated_rounds, sources_alone


def composition(
    names: Sequence[str], twins: Sequence[Source], worlds: Sequence[int], s: contenders.Settings, window: int
) -> tuple[list[dict[str, Any]], list[int] | None]:
    """One entry per (world, contender), and the source sequence of shardpipe's first epoch at world 1
    (None when world 1 did not run), which the speed run's full-size epoch must repeat."""
    fractions = weights([t.spec for t in twins])
    sizes = [t.spec.num_samples for t in twins]
    results: list[dict[str, Any]] = []
    first: list[int] | None = None
    for world in worlds:
        for name in names:
            started = time.perf_counter()
            trace = contenders.run(name, twins, world, s)
            entry: dict[str, Any] = {
                "contender": name,
                "world_size": world,
                "errors": metrics.composition(trace, fractions, s.num_workers, window),
                "repeats": metrics.excess(trace, sizes),
                "repeats_in_order": metrics.repeats(trace, sizes),
                "samples_per_epoch": statistics.mean(
                    sum(len(b.sources) for batches in ranks for b in batches) for ranks in trace
                ),
                "seconds": round(time.perf_counter() - started, 2),
            }
            if name == "shardpipe" and world == 1:
                first = metrics.concat(trace[0][0]).tolist()
            results.append(entry)
            shown = "  ".join(f"{kind} {entry['errors'][kind]:.2f}" for kind in metrics.KINDS)
            repeats = f"repeats {entry['repeats']} (in training order {entry['repeats_in_order']})"
            print(f"  W={world} {name:20} {shown}  {repeats}", flush=True)
    return results, first


def speed(
    full: Sequence[Source], s: contenders.Settings, repeats: int, warmup: int
) -> tuple[dict[str, list[float]], dict[str, Any], list[int]]:
    """(samples/s per round of ``mixture`` and ``alone`` in a fresh loader's first epoch, and of
    ``mixture_next`` and ``alone_next`` in the same loaders' next; their raw timings; the mixture's first
    source sequence). The sources alone read the counts the mixture's epoch holds (largest remainder)."""
    counts = metrics.largest_remainder(weights([f.spec for f in full]), sum(f.spec.num_samples for f in full))
    first: list[list[int]] = []

    def mix() -> list[Timing]:
        timings = mixture.timed_epochs(
            full, batch_size=s.batch_size, num_workers=s.num_workers, warmup=warmup, seed=s.seed
        )
        if not first:
            first.append(timings[0].sources)
        return timings

    def alone() -> list[Timing]:
        return sources_alone(
            full, counts, batch_size=s.batch_size, num_workers=s.num_workers, warmup=warmup, seed=s.seed
        )

    rounds = rotated_rounds(repeats, {"mixture": mix, "alone": alone})
    per_s: dict[str, list[float]] = {}
    raw: dict[str, Any] = {"alone_counts": counts}
    for name, runs in rounds.items():
        for k, (suffix, _) in enumerate(PASSES):
            per_s[name + suffix] = [timings[k].samples_per_s for timings in runs]
            raw[name + suffix] = [{"samples": t[k].samples, "seconds": t[k].seconds} for t in runs]
    return per_s, raw, first[0] if first else []
