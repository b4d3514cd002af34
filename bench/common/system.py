"""What the machine is, what its disk can do, and how to make its page cache cold.

Eviction uses ``posix_fadvise(POSIX_FADV_DONTNEED)`` per file (after ``fdatasync``: dirty pages cannot be
dropped). Whether it worked is checked, not assumed: a probe file is read warm, evicted, and read again;
a "cold" read no slower than twice the warm one means the kernel (or a RAM-backed file system) kept it.
The physical floor is one sequential pass over the shard files in large reads: no parsing, no workers.
"""

from __future__ import annotations

import compileall
import contextlib
import os
import platform
import subprocess
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
import torch

READ_CHUNK = 8 << 20
PROBE_BYTES = 64 << 20
ROOT = Path(__file__).resolve().parents[2]


def hardware() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores_logical": psutil.cpu_count(logical=True),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "gpu": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1)}
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions() -> dict[str, str]:
    names = (
        "shardpipe",
        "torch",
        "numpy",
        "pyarrow",
        "webdataset",
        "lmdb",
        "tfrecord",
        "psutil",
        "matplotlib",
    )
    found = {"python": platform.python_version()}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    found["shardpipe commit"] = commit()
    return found


def commit() -> str:
    """The checkout's git commit, marked when tracked files differ from it: a figure belongs to the code
    that produced it, which the package version alone does not name. 'unknown' outside a git checkout.
    The benchmarks' own page and plots (``docs/``) do not count: the runs write them."""
    try:
        head = _git("rev-parse", "--short=12", "HEAD").strip()
        changed = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs").strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head} + uncommitted changes" if changed else head


def _git(*args: str) -> str:
    command = ["git", "--no-optional-locks", "-C", str(ROOT), *args]  # no-optional-locks: index untouched
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=30).stdout


def compile_sources() -> None:
    """Write the project's bytecode, as ``pip install`` does, so that a timed command started in a fresh
    interpreter loads it instead of compiling every module again (as it would where
    ``PYTHONDONTWRITEBYTECODE`` is set, or after an edit): what a user's installed copy pays."""
    for package in ("shardpipe", "loaders", "bench"):
        compileall.compile_dir(ROOT / package, quiet=1)


def evict(paths: list[Path]) -> None:
    """Ask the kernel to drop these files from the page cache."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_all(paths: list[Path]) -> tuple[int, float]:
    """Read the files front to back in large chunks; return (bytes, seconds)."""
    total, start = 0, time.perf_counter()
    buffer = bytearray(READ_CHUNK)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                total += n
    return total, time.perf_counter() - start


def settle(paths: list[Path]) -> None:
    """Evict the files, then read them back front to back: every file's page cache then comes from one
    sequential read, whoever wrote it and however it was read since. The kernel keeps a file's pages in
    folios whose size depends on that history (a file just written, or read by readahead, gets large ones
    that map with few page faults; one faulted in page by page, small ones), and a memory-mapped reader's
    first pass costs accordingly, so warm runs start from the same history for every contender."""
    evict(paths)
    read_all(paths)


def check_eviction(cache: Path) -> dict[str, Any]:
    """Time a probe file warm, then after eviction: did eviction make reads slower?"""
    probe = cache / "evict-probe.bin"
    if not probe.exists() or probe.stat().st_size != PROBE_BYTES:
        cache.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(os.urandom(PROBE_BYTES))
    read_all([probe])
    _, warm = read_all([probe])
    evict([probe])
    _, cold = read_all([probe])
    ratio = cold / max(warm, 1e-9)
    return {
        "effective": ratio > 2.0,
        "warm_read_mb_per_s": round(PROBE_BYTES / warm / 1e6, 1),
        "evicted_read_mb_per_s": round(PROBE_BYTES / cold / 1e6, 1),
        "slowdown": round(ratio, 2),
    }


def floor(paths: list[Path], payload_bytes: int, *, cold: bool) -> dict[str, float]:
    """Sequential read of the shard files: file MB/s, and the payload MB/s that pass carries."""
    if cold:
        evict(paths)
    else:
        read_all(paths)  # make sure they are cached
    num_bytes, seconds = read_all(paths)
    return {
        "file_mb_per_s": num_bytes / seconds / 1e6,
        "payload_mb_per_s": payload_bytes / seconds / 1e6,
        "seconds": seconds,
    }


class PeakRss:
    """Samples the RSS of this process plus its children (DataLoader workers) every ``interval`` s.

    Summed RSS counts pages shared between parent and forked workers more than once: an upper bound.
    """

    def __init__(self, interval: float = 0.05) -> None:
        self.interval, self.peak = interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        me = psutil.Process()
        while True:
            total = me.memory_info().rss
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):  # a worker may exit meanwhile
                    total += child.memory_info().rss
            self.peak = max(self.peak, total)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
