"""The pack processes' Linux tuning: what each call changes, measured where it can be."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from shardpipe.tuning import start_writeback

_CHURN = """
import resource, sys
from shardpipe.tuning import keep_freed_memory
if sys.argv[1] == "tuned":
    keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
blocks = [bytearray(65536) for _ in range(256)]  # 16 MiB in 64 KiB blocks, as a shard's chunk holds
del blocks
before = faults()
for _ in range(4):
    blocks = [bytearray(65536) for _ in range(256)]
    del blocks
print(faults() - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")
def test_keep_freed_memory_stops_refaulting_freed_chunks() -> None:
    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, check=True)
        return int(out.stdout)

    default, tuned = faults("default"), faults("tuned")
    assert default > 4 * 4000  # each round faults its 16 MiB (4,096 pages) in again
    assert tuned < default / 4


def test_start_writeback_leaves_content_alone(tmp_path: Path) -> None:
    path = tmp_path / "shard"
    path.write_bytes(b"x" * 100_000)
    start_writeback(path)
    assert path.read_bytes() == b"x" * 100_000
    with pytest.raises(FileNotFoundError):
        start_writeback(tmp_path / "missing")
