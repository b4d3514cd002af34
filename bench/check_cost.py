"""``python -m bench.check_cost``: what the per-sample checksum checks cost a reader, per format.

Writes one shard per format and sample size (1 KiB, 64 KiB; two fields, the sample's data plus a short
label), reads each once to warm the page cache, then reads the whole shard through one reader as the loader
does (``read_runs`` over windows of 1024 samples, in runs of 1024 and of 16 samples), with ``check=True``
and ``check=False`` interleaved (the order alternating each repeat), and reports the median time of each and
their ratio. Reader level: no DataLoader, no decoding. ``--loader`` adds the end-to-end figure: whole
epochs of ``make bench-io``'s datasets through ``make_loader`` (``--workers``, batch 64), checks on and off
interleaved, as samples/s and as CPU time per sample summed over the process and its workers. On a machine
where the workers and the trainer share the cores, the CPU figure is the steadier one: wall-clock speed
of single epochs varies by more than the checks cost.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from bench.data import PROFILES, prepare
from loaders import ShardedDataset, make_loader
from shardpipe.formats import FORMAT_NAMES, get_format
from shardpipe.formats.base import Format
from shardpipe.formats.layout import ShardIndex

SIZES = {"1KiB": 1024, "64KiB": 65536}
SPANS = (1024, 16)
WINDOW = 1024


def write_shard(fmt: Format, path: Path, num_samples: int, size: int) -> ShardIndex:
    data = os.urandom(size + num_samples)
    writer = fmt.open_writer(path)
    keys = [f"c{i % 10}/{i:07d}" for i in range(num_samples)]
    batch = max(1, (1 << 20) // size)
    for first in range(0, num_samples, batch):
        rows = range(first, min(first + batch, num_samples))
        writer.write_batch(
            [keys[i] for i in rows],
            ["bin", "cls"],
            [[data[i : i + size] for i in rows], [b"%d" % (i % 10) for i in rows]],
        )
    return writer.close()


def read_all(
    fmt: Format,
    path: Path,
    index: ShardIndex | None,
    num_samples: int,
    span: int,
    check: bool,
    passes: int = 1,
) -> float:
    """CPU seconds per pass over the whole shard, through one reader (CPU time: the machine is shared)."""
    start_time = time.process_time()
    with fmt.open_reader(path, index, check=check) as reader:
        for _ in range(passes):
            for window in range(0, num_samples, WINDOW):
                stop = min(window + WINDOW, num_samples)
                reader.read_runs(
                    [(a, min(a + span, stop)) for a in range(window, stop, span)], ["bin", "cls"]
                )
    return (time.process_time() - start_time) / passes


def loader_epoch(root: Path, check: bool, workers: int, seed: int) -> tuple[float, float, int]:
    """One epoch through ``make_loader`` (batch 64): wall seconds, CPU seconds of this process and its
    workers (which exit at the epoch's end), samples."""

    def cpu() -> float:
        own, workers_ = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + workers_.ru_utime + workers_.ru_stime

    dataset = ShardedDataset(root, seed=seed, check=check)
    loader = make_loader(dataset, 64, workers, persistent_workers=False)
    start_cpu, start = cpu(), time.perf_counter()
    samples = sum(len(batch["__key__"]) for batch in loader)
    wall = time.perf_counter() - start
    del loader
    return wall, cpu() - start_cpu, samples


def loader_table(repeats: int, workers: int, cache: Path) -> None:
    """The end-to-end cost: whole epochs of ``make bench-io``'s datasets, checks on and off interleaved."""
    print(
        f"\n# check cost through make_loader, {workers} workers, batch 64, whole epochs, warm cache; median "
        f"of {repeats} interleaved epochs; CPU = this process and its workers"
    )
    print("| format | profile | samples/s off | on | wall cost | CPU µs/sample off | on | CPU cost |")
    print("|---|---|---|---|---|---|---|---|")
    for profile in ("small", "large"):
        data = prepare(PROFILES[profile], cache, log=False)
        for name in FORMAT_NAMES:
            runs: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
            for repeat in range(repeats):
                for check in (True, False) if repeat % 2 == 0 else (False, True):
                    runs[check].append(loader_epoch(data.packed(name), check, workers, repeat))
            speed = {c: statistics.median(n / wall for wall, _, n in runs[c]) for c in runs}
            cpu = {c: statistics.median(used / n * 1e6 for _, used, n in runs[c]) for c in runs}
            print(
                f"| {name} | {profile} | {speed[False]:,.0f} | {speed[True]:,.0f} | "
                f"{speed[False] / speed[True] - 1:+.1%} | {cpu[False]:.2f} | {cpu[True]:.2f} | "
                f"{cpu[True] / cpu[False] - 1:+.1%} |"
            )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.check_cost", description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="smaller shards, 3 repeats")
    p.add_argument("--formats", default=",".join(FORMAT_NAMES))
    p.add_argument("--loader", action="store_true", help="also whole epochs through make_loader")
    p.add_argument("--workers", type=int, default=2, help="--loader: DataLoader workers")
    p.add_argument("--cache", type=Path, default=Path("bench-results/cache"), help="--loader: data cache")
    args = p.parse_args(argv)
    repeats = 3 if args.quick else args.repeats
    mib = 16 if args.quick else 64
    print(
        f"# check cost, reader level, warm cache; {mib} MiB shards; median of {repeats} interleaved runs "
        f"of >= 0.2 s each, CPU time; {os.cpu_count()} CPUs"
    )
    print("| format | sample | span | samples | check=False ms/pass | check=True ms/pass | cost |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.formats.split(","):
            fmt = get_format(name)
            for label, size in SIZES.items():
                num_samples = (mib << 20) // size
                path = Path(tmp) / f"{name}-{label}{fmt.suffix}"
                index = write_shard(fmt, path, num_samples, size)
                index_or_none = index if fmt.needs_index else None
                for span in SPANS:
                    once = read_all(fmt, path, index_or_none, num_samples, span, True)  # also warms the cache
                    passes = max(1, round(0.2 / once))
                    times: dict[bool, list[float]] = {True: [], False: []}
                    for repeat in range(repeats):
                        for check in (True, False) if repeat % 2 == 0 else (False, True):
                            times[check].append(
                                read_all(fmt, path, index_or_none, num_samples, span, check, passes)
                            )
                    off, on = statistics.median(times[False]) * 1e3, statistics.median(times[True]) * 1e3
                    cost = on / off - 1
                    print(
                        f"| {name} | {label} | {span} | {num_samples} | {off:.1f} | {on:.1f} | {cost:+.1%} |"
                    )
                path.unlink()
    if args.loader:
        loader_table(repeats, args.workers, args.cache)


if __name__ == "__main__":
    main()
