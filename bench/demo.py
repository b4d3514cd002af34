"""``make demo``: real small files -> shards in every format -> verified -> 2-rank DDP training on CPU.

Why this shape: it exercises the whole user path with nothing downloaded. scikit-learn bundles 1,797 8x8
handwritten digits; written as one PNG per sample in class folders they are the many-small-files case that
shardpipe exists for. Each format is packed, verified and inspected through the CLI exactly as a user would
type it, then ``torchrun`` trains on the chosen pack with 2 gloo ranks and checks the accuracy bar.

    python -m bench.demo [--out demo-out] [--epochs 10] [--format tar]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

FORMATS = ("tar", "lmdb", "tfrecord")
NUM_DIGITS = 1797  # sklearn.datasets.load_digits()
PACK_OPTIONS = (
    "--labels", "dirname", "--split", "train=0.8,val=0.2", "--seed", "0",
    "--max-samples", "200", "--workers", "2", "--overwrite", "--quiet",
)  # fmt: skip


def digit_paths(root: Path) -> list[Path]:
    """Where each digit goes: ``<root>/<class>/<index:05d>.png``, in dataset order."""
    from sklearn.datasets import load_digits

    targets = load_digits().target
    return [root / str(int(label)) / f"{index:05d}.png" for index, label in enumerate(targets)]


def write_digits(root: Path) -> bool:
    """Write the digits as grayscale PNGs unless ``root`` already holds all of them; True if written.

    Files are written into ``<root>.partial`` and the folder renamed when complete, so an interrupted run
    never leaves a half-written tree that the next run would take for complete.
    """
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    expected = digit_paths(root)
    if all(p.is_file() and p.stat().st_size > 0 for p in expected) and _count_files(root) == len(expected):
        return False
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    digits = load_digits()
    for path, image in zip(digit_paths(partial), digits.images, strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = np.clip(np.rint(image * (255.0 / 16.0)), 0, 255).astype(np.uint8)  # 0..16 -> 0..255
        Image.fromarray(pixels).save(path, format="PNG")  # 2-D uint8 -> mode "L"
    shutil.rmtree(root, ignore_errors=True)
    partial.rename(root)
    return True


def _count_files(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file())


def shardpipe(*args: str | Path) -> str:
    """Run the CLI as a user would; return its output, raising with that output if it fails."""
    cmd = [sys.executable, "-m", "shardpipe", *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    output = (done.stdout + done.stderr).rstrip()
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd[1:])}` exited {done.returncode}:\n{output}")
    return output


def pack(src: Path, out: Path, format_name: str) -> str:
    """Pack ``src`` into ``out`` with the demo's fixed options (seeded 80/20 split, 200-sample shards)."""
    return shardpipe("pack", src, out, "--format", format_name, *PACK_OPTIONS)


def train_command(data: Path, epochs: int, nproc: int = 2, extra: Sequence[str] = ()) -> list[str]:
    """The torchrun command line for ``bench.train_digits`` (``python -m torch.distributed.run``)."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
        "-m", "bench.train_digits", "--data", str(data), "--epochs", str(epochs), *extra,
    ]  # fmt: skip


def train_env() -> dict[str, str]:
    """One thread per rank (2 ranks share 2 cores); also silences torchrun's OMP_NUM_THREADS warning."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
