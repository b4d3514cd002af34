"""``python -m bench.check_cost``: what the per-sample checksum checks cost a reader, per format.

Writes one shard per format and sample size (1 KiB, 64 KiB; two fields, the sample's data plus a short
label), reads each once to warm the page cache, then reads the whole shard through one reader as the loader
does (``read_runs`` over windows of 1024 samples, in runs of 1024 and of 16 samples), with ``check=True``
and ``check=False`` interleaved (the order alternating each repeat), and reports the median time of each and
their ratio. Reader level only: no DataLoader, no decoding; the end-to-end figure is ``make bench-io``'s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from shardpipe.formats import FORMAT_NAMES, Format, get_format
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.check_cost", description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="smaller shards, 3 repeats")
    p.add_argument("--formats", default=",".join(FORMAT_NAMES))
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


if __name__ == "__main__":
    main()
