"""Running a benchmark as its user does: ``python -m <module>`` from the repository root, the test failing
with the tail of the output unless it exits 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_module(module: str, *args: str, timeout: int) -> subprocess.CompletedProcess[str]:
    """``python -m module args``: its output, once it has exited 0 within ``timeout`` seconds."""
    command = [sys.executable, "-m", module, *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    return done
