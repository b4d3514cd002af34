"""Seeded fuzz: damaged datasets never reach the model silently and fail only with shardpipe's errors.

Small datasets are packed in every format, and one with compressed fields and dictionaries; each case
damages one file (a shard, its ``.idx``, a dictionary or the manifest) by flipping or zeroing bytes,
truncating it or appending junk, or flips a bit of one key, points the manifest at a file outside the
dataset, or turns an index or dictionary into a FIFO or a link to a device. It then reads the whole split
through ``ShardedDataset``, looks samples up by key and by position, and runs ``verify``. Cases run in a
child process (``tests.fuzz_worker``), so a fault in native code or a hang fails the test naming the case
instead of killing pytest.

``SHARDPIPE_FUZZ_CASES`` (default 400) and ``SHARDPIPE_FUZZ_SEED`` (default 0) make a longer local run:
``SHARDPIPE_FUZZ_CASES=1000 SHARDPIPE_FUZZ_SEED=7 pytest tests/test_fuzz.py``.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shardpipe.cli import main
from tests.datagen import payload
from tests.fuzz_worker import DATASETS

NUM_CASES = int(os.environ.get("SHARDPIPE_FUZZ_CASES", "400"))
SEED = int(os.environ.get("SHARDPIPE_FUZZ_SEED", "0"))
CASE_TIMEOUT_S = 60.0  # a case takes well under a second; only a hang comes near this
REPO = Path(__file__).resolve().parent.parent


def make_source(src: Path) -> dict[str, dict[str, str]]:
    """48 samples of two fields, sizes from empty to past an LMDB page (so LMDB shards have overflow pages
    and several leaves under a branch page), one key long enough for a PAX header (the parser's path);
    return them as the worker compares them (hex by key)."""
    expected: dict[str, dict[str, str]] = {}
    for i in range(48):
        stem = f"{i:04d}" if i != 5 else "k" * 110
        key = f"c{i % 3}/{stem}"
        (src / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        sizes = {"bin": [0, 90, 700, 3000, 9000][i % 5], "txt": 1 + i}
        expected[key] = {}
        for field, size in sizes.items():
            data = payload(key, field, size)
            (src / f"{key}.{field}").write_bytes(data)
            expected[key][field] = data.hex()
    return expected


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("fuzz")
    expected = make_source(base / "src")
    for name, fmt in DATASETS.items():
        options = ["--compress", "zstd", "--compress-fields", "bin,txt"] if name == "zstd" else []
        command = ["pack", str(base / "src"), str(base / name), "--format", fmt, "--max-samples", "16", "-q"]
        result = CliRunner().invoke(main, [*command, *options])
        assert result.exit_code == 0, result.output
    assert list((base / "zstd" / "compression").glob("*.zdict"))  # the dictionaries are damaged too
    (base / "expected.json").write_text(json.dumps(expected))
    return base


def run_cases(base: Path, seed: int, num_cases: int) -> list[dict[str, Any]]:
    """Every case's result; a child that dies or hangs is restarted after the case it was running."""
    results: list[dict[str, Any]] = []
    case = 0
    while case < num_cases:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fuzz_worker",
                str(base),
                str(seed),
                str(case),
                str(num_cases - case),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert child.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(child.stdout, selectors.EVENT_READ)
        started: int | None = None
        timeout = 120.0  # the first line waits for the child's imports
        try:
            while True:
                if not selector.select(timeout):
                    results.append({"case": started, "read": "hang", "seed": seed})
                    break
                line = child.stdout.readline()
                if not line:  # the child ended: done, or died inside a case
                    code = child.wait()
                    if started is not None or code != 0:
                        results.append({"case": started, "read": f"crash (exit {code})", "seed": seed})
                    break
                word, _, rest = line.partition(" ")
                timeout = CASE_TIMEOUT_S
                if word == "begin":
                    started = int(rest)
                elif word == "result":
                    results.append(json.loads(rest))
                    started = None
        finally:
            child.kill()
            child.wait()
            selector.close()
            child.stdout.close()
        if started is None:
            break
        case = started + 1
    return results


@pytest.mark.slow
def test_damage_is_an_error_never_silent_nor_foreign(base: Path) -> None:
    results = run_cases(base, SEED, NUM_CASES)
    assert len(results) == NUM_CASES
    bad = [r for r in results if r["read"] not in ("error", "identical") or r.get("verify") == "foreign"]
    assert not bad, f"seed {SEED}: {len(bad)} bad cases:\n" + "\n".join(json.dumps(r) for r in bad[:10])
    undetected = [r for r in results if r["kind"] != "manifest" and r.get("verify") == "clean"]
    assert not undetected, "verify missed damage to a shard or index:\n" + "\n".join(
        map(json.dumps, undetected)
    )
    # the harness itself can fail: damage must be caught on read in most cases, and reach every format
    caught = {name: sum(r["read"] == "error" for r in results if r["format"] == name) for name in DATASETS}
    assert all(count > 0 for count in caught.values()), caught
    assert sum(caught.values()) > NUM_CASES // 2, caught


@pytest.mark.slow
def test_the_harness_names_a_crashing_case(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault in the child is reported as a crash of that case, and the remaining cases still run."""
    monkeypatch.setenv("SHARDPIPE_FUZZ_CRASH_AT", "1")
    results = run_cases(base, SEED, 3)
    assert [r["case"] for r in results] == [0, 1, 2]
    assert results[1]["read"].startswith("crash") and results[0]["read"] in ("error", "identical")
