"""``python -m bench.demo``: write the digits, pack, verify and inspect every format, train, summarize."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import bench.demo
from bench.demo.data import NUM_DIGITS, write_digits
from bench.demo.run import FORMATS, pack, shardpipe, train_command, train_env


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.demo", description=(bench.demo.__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=Path("demo-out"), help="output folder")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--format", choices=FORMATS, default="tar", help="pack to train on")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (processes) for torchrun")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    digits = out / "digits"
    wrote = write_digits(digits)
    timings["write digits"] = time.perf_counter() - t0
    print(f"== digits: {NUM_DIGITS} PNGs in {digits}/<class>/ ({'written' if wrote else 'already there'})")

    for format_name in FORMATS:
        packed = out / f"packed-{format_name}"
        t0 = time.perf_counter()
        print(f"\n== pack {format_name} -> {packed}")
        print(pack(digits, packed, format_name))
        timings[f"pack {format_name}"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        print(f"\n== verify {format_name}")
        print(shardpipe("verify", packed, "--quiet"))
        print(f"\n== inspect {format_name}")
        print(shardpipe("inspect", packed))
        timings[f"verify+inspect {format_name}"] = time.perf_counter() - t0

    data = out / f"packed-{args.format}"
    cmd = train_command(data, args.epochs, args.nproc)
    print(f"\n== train on {data} with {args.nproc} ranks (gloo, CPU)\n$ {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    code = subprocess.run(cmd, env=train_env(), check=False).returncode
    timings["train"] = time.perf_counter() - t0

    print("\n== summary")
    for stage, seconds in timings.items():
        print(f"  {stage:<24} {seconds:6.1f} s")
    total = time.perf_counter() - started
    verdict = "OK" if code == 0 else f"FAILED (training exited {code})"
    print(f"  {'total':<24} {total:6.1f} s\ndemo {verdict}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
