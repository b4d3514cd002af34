"""``shardpipe pack --engine ray`` on a two-node cluster and on a local Ray: byte-identical to local."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow
import pyarrow.csv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from shardpipe.cli import main
from shardpipe.sources import file_list
from testkit.ray_cluster import session_processes, token_auth, two_node_cluster
from tests.datagen import make_tree
from tests.maps import MARKS_ENV

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[1]
RAY_TASKS_GONE_WITHIN_S = 10.0
"""How long the tasks of a killed driver may keep running: Ray ends them once it sees the driver gone."""
OPTIONS = ["--labels", "dirname", "--split", "train=0.8,val=0.2", "--max-samples", "6", "-q"]


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_engine_ray_matches_local_on_a_cluster_and_a_local_ray(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src, 80, classes=4)
    local = run("pack", src, tmp_path / "local", "--format", "tfrecord", *OPTIONS, "--workers", "2")
    assert local.exit_code == 0, local.output
    with token_auth():
        with two_node_cluster() as cluster:
            on_cluster = run(
                "pack", src, tmp_path / "cluster", "--format", "tfrecord", *OPTIONS,
                "--engine", "ray", "--ray-address", cluster.address,
            )  # fmt: skip
        local_ray = run("pack", src, tmp_path / "ray", "--format", "tfrecord", *OPTIONS, "--engine", "ray")
        missing = run("pack", tmp_path / "missing", tmp_path / "x", "--format", "tar", "--engine", "ray")
    assert on_cluster.exit_code == 0, on_cluster.output
    assert local_ray.exit_code == 0, local_ray.output
    assert files(tmp_path / "cluster") == files(tmp_path / "local")  # shards, indexes and manifest
    assert files(tmp_path / "ray") == files(tmp_path / "local")
    assert missing.exit_code == 1 and "does not exist" in missing.output


def test_ray_address_needs_engine_ray(tmp_path: Path) -> None:
    result = run("pack", tmp_path, tmp_path / "out", "--format", "tar", "--ray-address", "10.0.0.5:6379")
    assert result.exit_code == 2 and "--ray-address 10.0.0.5:6379 needs --engine ray" in result.output


def test_killed_ray_driver_then_resume_completes_the_pack(tmp_path: Path) -> None:
    """The driver of `--engine ray` is killed mid-pack; `--resume` (here with the local engine) finishes it,
    keeping the finished shards, and the tree equals a local pack's."""
    make_tree(tmp_path / "src", 2000, fields=("bin",), size=1000)
    args = ["--format", "tar", "--max-samples", "10", "--quiet"]
    assert run("pack", tmp_path / "src", tmp_path / "local", *args).exit_code == 0
    out = tmp_path / "out"
    with token_auth(), two_node_cluster() as cluster:  # the child inherits the token from os.environ
        cmd = [sys.executable, "-m", "shardpipe", "pack", str(tmp_path / "src"), str(out), *args,
               "--engine", "ray", "--ray-address", cluster.address]  # fmt: skip
        proc = subprocess.Popen(cmd, start_new_session=True)
        journal = out / ".shardpipe-journal.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if journal.exists() and len(journal.read_text().splitlines()) >= 4:
                break
            time.sleep(0.005)
        assert proc.poll() is None, "the pack finished before it could be killed; make the input larger"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (out / "manifest.json").exists()
    resumed = run("pack", tmp_path / "src", out, *args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert "resumed: kept" in resumed.output
    assert files(out) == files(tmp_path / "local")


def test_killed_ray_driver_leaves_no_task_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver of `--engine ray` is killed outright while a slow map runs on both nodes: Ray ends the
    worker processes running its tasks, and nothing of the driver's session is left."""
    make_tree(tmp_path / "src", 2000, fields=("bin",))
    marks = tmp_path / "marks"  # each process running the map leaves a file named after its pid
    marks.mkdir()
    monkeypatch.setenv(MARKS_ENV, str(marks))  # the nodes' workers inherit these from `ray start`
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    with token_auth(), two_node_cluster() as cluster:
        cmd = [sys.executable, "-m", "shardpipe", "pack", str(tmp_path / "src"), str(tmp_path / "out"),
               "--format", "tar", "--max-samples", "10", "--map", "tests.maps:slow", "--quiet",
               "--engine", "ray", "--ray-address", cluster.address]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
        deadline = time.monotonic() + 120
        while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        assert proc.poll() is None, "the pack finished before it could be killed; make the input larger"
        running = [psutil.Process(int(mark.name)) for mark in marks.iterdir()]
        assert len(running) >= 2, "the map never ran on both nodes at once"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        _, alive = psutil.wait_procs(running, timeout=RAY_TASKS_GONE_WITHIN_S)
        assert not alive, f"still running {RAY_TASKS_GONE_WITHIN_S} s after the driver was killed: {alive}"
        assert session_processes([proc.pid]) == []


def test_engine_ray_on_a_file_list_matches_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """csv and parquet lists (paths and a literal label column), read in many pieces by Ray tasks, pack to
    the same bytes as a one-worker local pack that reads each list as one piece."""
    make_tree(tmp_path / "src", 40, classes=2, fields=("bin",))
    rows = [
        {
            "key": f"{p.parent.name}/{p.stem}",
            "bin": p.relative_to(tmp_path).as_posix(),
            "label": p.parent.name,
        }
        for p in sorted((tmp_path / "src").rglob("*.bin"))
    ]
    lists = [tmp_path / "list.csv", tmp_path / "list.parquet"]
    pyarrow.csv.write_csv(pyarrow.Table.from_pylist(rows), lists[0])
    pq.write_table(pyarrow.Table.from_pylist(rows), lists[1], row_group_size=4)
    args = ["--format", "lmdb", "--literal", "label", "--max-samples", "7", "-q"]
    for listing in lists:
        assert (
            run("pack", listing, tmp_path / f"local-{listing.suffix}", *args, "--workers", "1").exit_code == 0
        )
    monkeypatch.setattr(file_list, "PIECE_BYTES", 200)  # about 6 csv rows, or one row group, per task
    with token_auth():
        for listing in lists:
            on_ray = run("pack", listing, tmp_path / f"ray-{listing.suffix}", *args, "--engine", "ray")
            assert on_ray.exit_code == 0, on_ray.output
            assert files(tmp_path / f"ray-{listing.suffix}") == files(tmp_path / f"local-{listing.suffix}")
