"""The settings a pack process applies to itself: what each changes, observed where it can be."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

_CHURN = """
import resource, sys
from shardpipe.process_settings import keep_freed_memory
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
    assert default > 3 * 4096  # most rounds fault their 16 MiB (4,096 pages each) in again
    assert tuned < default / 4


_CLI_THREADS = """
import os, sys
from shardpipe.cli import main
try:
    main([*sys.argv[1:], "--quiet"])
except SystemExit:
    pass
import numpy  # imported by the pack above
from threadpoolctl import threadpool_info  # comes with scikit-learn
pools = [p["num_threads"] for p in threadpool_info() if p["internal_api"] == "openblas"]
print(os.environ.get("OPENBLAS_NUM_THREADS"), *pools)
"""


def test_cli_keeps_openblas_from_starting_threads(tmp_path: Path) -> None:
    """OpenBLAS's own count of its threads (not the process's threads, which other pools may briefly add)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("x")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    args = [sys.executable, "-c", _CLI_THREADS, "pack", str(tmp_path / "src"), str(tmp_path / "out")]
    out = subprocess.run([*args, "--format", "tar"], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split()[-2:] == ["1", "1"]  # the variable is set, and OpenBLAS runs one thread
    env["OPENBLAS_NUM_THREADS"] = "2"
    out = subprocess.run([*args[:-1], str(tmp_path / "out2"), "--format", "tar"], capture_output=True,
                         text=True, env=env, check=True)  # fmt: skip
    assert out.stdout.split()[-2:] == ["2", "2"]  # a value the user set wins


def test_pausing_gc_restores_the_collector_as_it_found_it() -> None:
    import gc

    from shardpipe.process_settings import pausing_gc

    assert gc.isenabled()
    with pytest.raises(RuntimeError), pausing_gc():
        assert not gc.isenabled()
        raise RuntimeError("the pack failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with pausing_gc():
            pass
        assert not gc.isenabled()  # a caller who had it off keeps it off
    finally:
        gc.enable()
