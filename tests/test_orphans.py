"""A pack whose driver is killed outright (SIGKILL: the OOM killer, a preempted node) leaves no process
behind, and ``--resume`` then finishes it byte-identical to an uninterrupted pack.

Each pack runs as a real process leading a session of its own; its pool workers, and the fork server
and resource tracker that some start methods add, are found as the other members of that session. Only
the driver is killed, at a chosen moment: while its workers start, in the middle of their tasks, or while
they wait for work (the driver stopped first, so they run out of it). Whatever a test finds still alive is
killed when it ends, so a failure leaves nothing running either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from shardpipe import PackOptions, pack_items
from shardpipe.cli import main
from testkit.ray_cluster import session_processes
from tests.datagen import make_tree
from tests.maps import MARKS_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[1]
GONE_WITHIN_S = 5.0
"""How long the processes of a killed pack may outlive its driver."""
WAIT_S = 60.0
"""How long a moment to kill at may take to come, on a loaded machine."""
IDLE_S = 1.0
"""How long the workers must have left the slow map alone to count as waiting."""
PACK_ARGS = ["--format", "tar", "--max-samples", "10", "--workers", "2", "--quiet"]
MOMENTS = ["start-up", "mid-task", "waiting"]


def tree_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def cli(*args: str | Path) -> None:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output


@contextmanager
def driver(command: list[str], marks: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``command`` started as the leader of a new session; every process of that session killed at exit."""
    env = {**os.environ, MARKS_ENV: str(marks), "PYTHONPATH": str(ROOT)}
    marks.mkdir()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        left = session_processes([proc.pid])
        for member in left:
            with suppress(psutil.NoSuchProcess):
                member.kill()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        psutil.wait_procs(left, timeout=10)


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert proc.poll() is None, f"the pack ended before {what}; make its input larger or slower"
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S} s"
        time.sleep(0.002)


def workers_of(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    return [p for p in session_processes([proc.pid]) if p.pid != proc.pid]


def kill_at(moment: str, proc: subprocess.Popen[bytes], marks: Path) -> None:
    """SIGKILL the driver alone, at ``moment``, with its two workers alive."""
    if moment == "start-up":  # as soon as both workers exist: before their first task, maybe mid-set-up
        wait_for(lambda: len(workers_of(proc)) >= 2, proc, "two workers")
    elif moment == "mid-task":  # a worker has begun a slow map, or shards are being written
        wait_for(lambda: any(marks.iterdir()) or len(journal_lines(marks.parent / "out")) >= 4, proc, "task")
    else:  # the driver stopped: its workers finish what was queued, then wait for more
        wait_for(lambda: len(journal_lines(marks.parent / "out")) >= 1, proc, "finished task")
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + WAIT_S
        while not waiting(workers_of(proc), marks):
            assert time.monotonic() < deadline, "the workers never waited"
            time.sleep(0.1)
    assert len(workers_of(proc)) >= 2, "the workers were not alive when the driver was killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def waiting(workers: list[psutil.Process], marks: Path) -> bool:
    """No worker on a CPU, and none in a slow map (which sleeps) for a while."""
    last_map_call = max((mark.stat().st_mtime for mark in marks.iterdir()), default=0.0)
    return time.time() - last_map_call > IDLE_S and all(p.status() != psutil.STATUS_RUNNING for p in workers)


def journal_lines(out: Path) -> list[str]:
    journal = out / ".shardpipe-journal.jsonl"
    return journal.read_text().splitlines() if journal.exists() else []


def assert_nothing_left(proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := session_processes([proc.pid])) and time.monotonic() < deadline:
        time.sleep(0.05)
    names = ", ".join(f"{p.pid} {p.name()}" for p in left if p.is_running())
    assert not left, f"still running {GONE_WITHIN_S} s after the driver was killed: {names}"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("orphans") / "src"
    make_tree(src, 600, fields=("bin",), size=1000)
    return src


@pytest.mark.parametrize("moment", MOMENTS)
def test_killed_pack_leaves_no_process_and_resumes_identical(
    tmp_path: Path, source: Path, moment: str
) -> None:
    cli("pack", source, tmp_path / "reference", *PACK_ARGS)
    out = tmp_path / "out"
    with driver([sys.executable, "-m", "shardpipe", "pack", str(source), str(out), *PACK_ARGS],
                tmp_path / "marks") as proc:  # fmt: skip
        kill_at(moment, proc, tmp_path / "marks")
        assert_nothing_left(proc)
    assert not (out / "manifest.json").exists()
    cli("pack", source, out, *PACK_ARGS, "--resume")
    assert tree_files(out) == tree_files(tmp_path / "reference")


@pytest.mark.parametrize("moment", ["mid-task", "waiting"])
def test_killed_map_pack_leaves_no_process_and_resumes_identical(
    tmp_path: Path, source: Path, moment: str
) -> None:
    args = [*PACK_ARGS, "--map", "tests.maps:slow"]
    cli("pack", source, tmp_path / "reference", *args)
    out = tmp_path / "out"
    with driver([sys.executable, "-m", "shardpipe", "pack", str(source), str(out), *args],
                tmp_path / "marks") as proc:  # fmt: skip
        kill_at(moment, proc, tmp_path / "marks")
        assert_nothing_left(proc)
    cli("pack", source, out, *args, "--resume")
    assert tree_files(out) == tree_files(tmp_path / "reference")


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_killed_pack_items_leaves_no_process_under_any_start_method(tmp_path: Path, method: str) -> None:
    num_items = 200
    pack_items(range(num_items), "tests.maps:slow_item", tmp_path / "reference",
               PackOptions(format="tar", max_samples=5, workers=1), quiet=True)  # fmt: skip
    out = tmp_path / "out"
    command = [sys.executable, "-m", "tests.pack_items_job", str(out), method, str(num_items)]
    with driver(command, tmp_path / "marks") as proc:
        kill_at("mid-task", proc, tmp_path / "marks")
        assert_nothing_left(proc)
    with driver([*command, "--resume"], tmp_path / "marks-resume") as resumed:
        assert resumed.wait(timeout=WAIT_S) == 0
    assert tree_files(out) == tree_files(tmp_path / "reference")
