"""The child process of ``test_fuzz``: damages packed datasets and reads them back, one case at a time.

Run as ``python -m tests.fuzz_worker BASE SEED FIRST COUNT``: BASE holds one packed dataset per format
(``BASE/<format>``) and ``BASE/expected.json``. For each case ``FIRST <= i < FIRST + COUNT`` it prints
``begin i``, copies one dataset, damages one of its files as ``(SEED, i)`` decide, reads the whole split
through ``loaders.ShardedDataset`` and runs ``verify``, then prints ``result <json>``. A case that kills
the process (a fault in native code) or hangs is named by the last ``begin`` line its parent saw.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from shardpipe.errors import ShardpipeError

FORMATS = ("lmdb", "tar", "tfrecord")
DAMAGES = ("flip", "zero", "truncate", "append")


def plan_case(base: Path, seed: int, case: int) -> dict[str, Any]:
    """Which format, file and damage case ``case`` of ``seed`` is: the same on every run."""
    rng = random.Random(f"{seed}:{case}")
    fmt = FORMATS[case % len(FORMATS)]  # every format equally often
    root = base / fmt
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    kinds = {
        "manifest": [f for f in files if f == "manifest.json"],
        "index": [f for f in files if f.endswith(".idx")],
        "shard": [f for f in files if f != "manifest.json" and not f.endswith(".idx")],
    }
    kind = rng.choice([k for k, v in kinds.items() if v])
    return {
        "case": case,
        "format": fmt,
        "kind": kind,
        "file": rng.choice(kinds[kind]),
        "damage": rng.choice(DAMAGES),
        "seed": rng.getrandbits(32),
    }


def damage(path: Path, how: str, seed: int) -> str:
    """Change ``path``'s bytes (always: a damage that leaves the file as it was is redrawn)."""
    rng = random.Random(seed)
    raw = bytearray(path.read_bytes())
    original = bytes(raw)
    for _ in range(100):
        if how == "flip":
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(len(raw))] ^= rng.randint(1, 255)
            detail = "flipped bytes"
        elif how == "zero":
            start = rng.randrange(len(raw))
            length = rng.randint(1, 64)
            raw[start : start + length] = bytes(len(raw[start : start + length]))
            detail = f"zeroed [{start}, {start + length})"
        elif how == "truncate":
            raw = raw[: rng.randrange(len(raw))]
            detail = f"truncated to {len(raw)}"
        else:
            raw += rng.randbytes(rng.randint(1, 2048))
            detail = "junk appended"
        if bytes(raw) != original:
            break
        raw = bytearray(original)
    path.write_bytes(bytes(raw))
    return detail


def read_all(root: Path) -> list[dict[str, Any]]:
    from loaders import ShardedDataset

    return list(ShardedDataset(root, "train", shuffle=False))


def run_case(base: Path, plan: dict[str, Any], expected: dict[str, dict[str, str]]) -> dict[str, Any]:
    from shardpipe.tools.verify import verify

    result = dict(plan)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        shutil.copytree(base / plan["format"], root)
        result["detail"] = damage(root / plan["file"], plan["damage"], plan["seed"])
        try:
            samples = read_all(root)
        except ShardpipeError as exc:
            result["read"] = "error"
            result["error"] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            result["read"] = "foreign"
            result["error"] = "".join(traceback.format_exception(exc))[-1500:]
        else:
            got = {
                s["__key__"]: {k: v.hex() for k, v in s.items() if not k.startswith("__")} for s in samples
            }
            same = len(samples) == len(expected) and got == expected
            result["read"] = "identical" if same else "silent difference"
        try:
            problems = verify(root, quiet=True)
            result["verify"] = "problems" if problems else "clean"
        except ShardpipeError:
            result["verify"] = "error"
        except Exception as exc:
            result["verify"] = "foreign"
            result["verify_error"] = "".join(traceback.format_exception(exc))[-1500:]
    return result


def main() -> None:
    base, seed, first, count = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    expected = json.loads((base / "expected.json").read_text())
    import loaders  # noqa: F401 - pay the torch import before the first case's clock starts

    crash_at = os.environ.get("SHARDPIPE_FUZZ_CRASH_AT")  # the parent's own test of crash reporting
    print("ready", flush=True)
    for case in range(first, first + count):
        print(f"begin {case}", flush=True)
        if crash_at is not None and case == int(crash_at):
            os.kill(os.getpid(), signal.SIGSEGV)
        print("result " + json.dumps(run_case(base, plan_case(base, seed, case), expected)), flush=True)


if __name__ == "__main__":
    main()
