"""The demo's commands, run as a user types them: ``shardpipe`` subcommands and ``torchrun`` of
:mod:`bench.demo.train`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

FORMATS = ("tar", "lmdb", "tfrecord")
PACK_OPTIONS = (
    "--labels", "dirname", "--split", "train=0.8,val=0.2", "--seed", "0",
    "--max-samples", "200", "--workers", "2", "--overwrite", "--quiet",
)  # fmt: skip


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
    """The torchrun command line for ``bench.demo.train`` (``python -m torch.distributed.run``)."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
        "-m", "bench.demo.train", "--data", str(data), "--epochs", str(epochs), *extra,
    ]  # fmt: skip


def train_env() -> dict[str, str]:
    """One thread per rank (2 ranks share 2 cores); also silences torchrun's OMP_NUM_THREADS warning."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}
