"""RayExecutor on a local Ray it starts itself: results, errors, retries, the bound, the path check.

The cluster tests (two real nodes, the pack's shards) are in ``test_ray_cluster.py``: one process holds one
Ray connection, so the two modules' fixtures never overlap.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError, wait
from pathlib import Path

import psutil
import pytest

from shardpipe.errors import CorruptShardError, DataError, UsageError
from shardpipe.packing import PackOptions, pack
from shardpipe.packing.mapping import pieces as map_pieces
from shardpipe.packing.ray_engine import MAX_RETRIES, RayExecutor, TaskLostError, check_visible
from shardpipe.storage import open_store
from testkit.ray_cluster import free_port, local_ray_processes, token_auth
from testkit.servers import S3Server
from tests.datagen import make_tree

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]
WAIT_S = 60.0
"""Longest a test waits for a task to reach a point (worker start-up on a loaded machine included)."""


# Task functions: module-level, so they travel to Ray workers by name.


def double(x: int) -> int:
    return 2 * x


def raise_data(message: str) -> None:
    raise DataError(message)


def raise_corrupt() -> None:
    raise CorruptShardError.at("train/shard-000003.tar", "bad header", sample_index=7)


def count_and_raise(log: str) -> None:
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    raise DataError("fails on purpose")


def count_running(folder: str, partners: int) -> int:
    """Mark this task running, wait (bounded) for ``partners`` running tasks, return the most seen at once."""
    marker = Path(folder) / f"running-{os.getpid()}-{time.monotonic_ns()}"
    marker.touch()
    try:
        most = 0
        deadline = time.monotonic() + WAIT_S  # partners start within it even on a loaded machine
        while time.monotonic() < deadline:
            most = max(most, sum(1 for p in Path(folder).iterdir() if p.name.startswith("running-")))
            if most >= partners:
                time.sleep(0.3)  # room for a task beyond the bound to show up, were there one
                return max(most, sum(1 for p in Path(folder).iterdir() if p.name.startswith("running-")))
            time.sleep(0.02)
        return most
    finally:
        marker.unlink()


def block_first_attempt(folder: str, value: int) -> int:
    """First attempt: record this worker's pid and block until killed. A retry records its pid and returns."""
    first = Path(folder) / "first.pid"
    try:
        fd = os.open(first, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        (Path(folder) / "retry.pid").write_text(str(os.getpid()))
        return value * 2
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    time.sleep(WAIT_S * 3)  # the test kills this process long before
    return -1


def block_every_attempt(folder: str) -> None:
    """Record this attempt's pid and block until killed, on every attempt."""
    (Path(folder) / f"attempt-{os.getpid()}").touch()
    time.sleep(WAIT_S * 3)


_init_runs = 0


def count_init() -> None:
    global _init_runs
    _init_runs += 1


def init_runs(_: int) -> tuple[int, int]:
    return os.getpid(), _init_runs


def is_running(pid: int) -> bool:
    try:
        status: str = psutil.Process(pid).status()
        return bool(status != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def executor() -> Iterator[RayExecutor]:
    """A local Ray started by the executor (4 logical CPUs), stopped by its shutdown; nothing left after."""
    with token_auth():
        engine = RayExecutor(max_workers=4)
        try:
            yield engine
        finally:
            engine.shutdown()
        _, alive = psutil.wait_procs(local_ray_processes(), timeout=30)
        assert not alive, f"Ray processes left after shutdown: {[(p.pid, p.name()) for p in alive]}"


def test_submit_returns_results(executor: RayExecutor) -> None:
    futures = [executor.submit(double, i) for i in range(20)]
    assert [f.result(timeout=WAIT_S) for f in futures] == [2 * i for i in range(20)]
    assert list(executor.map(double, range(5), timeout=WAIT_S)) == [0, 2, 4, 6, 8]


def test_exceptions_come_back_as_themselves(executor: RayExecutor) -> None:
    with pytest.raises(DataError) as caught:
        executor.submit(raise_data, "no such file x").result(timeout=WAIT_S)
    assert type(caught.value) is DataError
    assert str(caught.value) == "no such file x"  # what the CLI prints: Ray's wrapper text is a note
    assert any("raised in a Ray task" in note for note in caught.value.__notes__)

    with pytest.raises(CorruptShardError) as corrupt:
        executor.submit(raise_corrupt).result(timeout=WAIT_S)
    assert type(corrupt.value) is CorruptShardError
    assert (corrupt.value.shard, corrupt.value.sample_index) == ("train/shard-000003.tar", 7)

    with pytest.raises(ZeroDivisionError):
        executor.submit(divmod, 1, 0).result(timeout=WAIT_S)


def test_exceptions_are_not_retried(executor: RayExecutor, tmp_path: Path) -> None:
    log = tmp_path / "attempts"
    with pytest.raises(DataError, match="fails on purpose"):
        executor.submit(count_and_raise, str(log)).result(timeout=WAIT_S)
    assert len(log.read_text().splitlines()) == 1


@pytest.mark.parametrize("bound", [1, 2])
def test_at_most_max_workers_tasks_run_at_once(executor: RayExecutor, tmp_path: Path, bound: int) -> None:
    # Ray has 4 CPUs here: only the executor's bound keeps the 6 tasks from running together.
    inner = RayExecutor(max_workers=bound)  # joins the connected Ray, leaves it connected
    try:
        futures = [inner.submit(count_running, str(tmp_path), bound) for _ in range(6)]
        seen = [f.result(timeout=WAIT_S) for f in futures]
    finally:
        inner.shutdown()
    assert max(seen) == bound, seen
    assert executor.submit(double, 1).result(timeout=WAIT_S) == 2  # the shared Ray is still connected


def test_killed_worker_is_retried(executor: RayExecutor, tmp_path: Path) -> None:
    future = executor.submit(block_first_attempt, str(tmp_path), 21)
    first = tmp_path / "first.pid"
    deadline = time.monotonic() + WAIT_S
    while not (first.exists() and first.read_text()):
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.05)
    pid = int(first.read_text())
    assert pid != os.getpid()
    assert psutil.Process(pid).name().startswith("ray::")  # a Ray worker, not the driver or a daemon
    os.kill(pid, signal.SIGKILL)
    assert future.result(timeout=WAIT_S * 2) == 42
    assert int((tmp_path / "retry.pid").read_text()) != pid


def test_task_lost_after_its_retries_is_a_data_error(executor: RayExecutor, tmp_path: Path) -> None:
    future = executor.submit(block_every_attempt, str(tmp_path))
    killed: set[int] = set()
    deadline = time.monotonic() + WAIT_S * 2
    while not future.done():
        assert time.monotonic() < deadline, f"still running after {len(killed)} kills"
        for marker in tmp_path.glob("attempt-*"):
            pid = int(marker.name.split("-")[1])
            if pid not in killed:
                killed.add(pid)
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    with pytest.raises(TaskLostError, match="rerun with --resume"):
        future.result()
    assert len(killed) == MAX_RETRIES + 1
    assert isinstance(future.exception(), DataError)  # the CLI's exit code 1


def test_shutdown_without_wait_cancels_running_tasks(executor: RayExecutor, tmp_path: Path) -> None:
    inner = RayExecutor(max_workers=1)
    running = inner.submit(block_first_attempt, str(tmp_path), 1)
    queued = inner.submit(double, 1)
    first = tmp_path / "first.pid"
    deadline = time.monotonic() + WAIT_S
    while not (first.exists() and first.read_text()):
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.05)
    inner.shutdown(wait=False)
    assert queued.cancelled()
    with pytest.raises(CancelledError):
        running.result(timeout=WAIT_S)
    pid = int(first.read_text())
    deadline = time.monotonic() + WAIT_S
    while is_running(pid):
        assert time.monotonic() < deadline, "the task runs on after the shutdown"
        time.sleep(0.05)


def test_cancelled_before_start_never_runs(executor: RayExecutor, tmp_path: Path) -> None:
    inner = RayExecutor(max_workers=1)
    try:
        running = inner.submit(count_running, str(tmp_path), 1)
        queued = inner.submit(count_and_raise, str(tmp_path / "attempts"))
        assert queued.cancel()
        assert running.result(timeout=WAIT_S) == 1
        done, _ = wait([queued], timeout=1)
        assert queued in done and queued.cancelled()
    finally:
        inner.shutdown()
    assert not (tmp_path / "attempts").exists()


def test_missing_path_names_node_and_path(executor: RayExecutor, tmp_path: Path) -> None:
    missing = tmp_path / "not" / "here"
    with pytest.raises(DataError) as caught:
        executor.submit(check_visible, [str(missing)]).result(timeout=WAIT_S)
    message = str(caught.value)
    assert str(missing) in message
    assert "Ray node " in message and "host " in message

    engine_checked = RayExecutor(visible_paths=[tmp_path, missing])
    try:  # what the driver sees is what the node must see: here the same machine, so it passes
        assert engine_checked.submit(double, 4).result(timeout=WAIT_S) == 8
    finally:
        engine_checked.shutdown()


def test_initializer_runs_once_per_worker_process(executor: RayExecutor) -> None:
    inner = RayExecutor(max_workers=2, initializer=count_init)
    try:
        seen = dict(inner.map(init_runs, range(12), timeout=WAIT_S))
    finally:
        inner.shutdown()
    assert set(seen.values()) == {1}, seen  # before each process's first task, never again
    assert _init_runs == 0  # it ran in the workers, not here


def test_shutdown_refuses_new_work_and_bounds_are_checked(executor: RayExecutor) -> None:
    inner = RayExecutor(max_workers=1)
    inner.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        inner.submit(double, 1)
    assert executor.submit(double, 2).result(timeout=WAIT_S) == 4  # not its Ray: still connected
    with pytest.raises(UsageError, match="max_workers must be at least 1, got 0"):
        RayExecutor(max_workers=0)


def test_an_address_nothing_listens_at_fails_at_once() -> None:
    port = free_port()  # nothing listens on it
    with pytest.raises(UsageError, match=f"cannot reach a Ray cluster at 127.0.0.1:{port}"):
        RayExecutor(address=f"127.0.0.1:{port}")
    with pytest.raises(UsageError, match="is not HOST:PORT"):
        RayExecutor(address="headnode")


def test_a_pack_from_and_to_s3_on_ray_equals_the_local_pack(
    executor: RayExecutor, tmp_path: Path, s3: S3Server, s3_root: str
) -> None:
    """The multi-node set-up the README asks for (SRC and OUT in a bucket): Ray tasks list, read, write,
    upload and check through the store, and the bucket ends up with the local pack's bytes."""
    options = s3.storage_options()
    make_tree(tmp_path / "src", 40, classes=4)
    opts = PackOptions(format="tar", max_samples=6, labels="dirname", split={"train": 0.75, "val": 0.25})
    local = pack(tmp_path / "src", tmp_path / "local", opts, quiet=True)
    src_url = f"{s3_root}-src"
    source = open_store(src_url, storage_options=options)
    for path in sorted(p for p in (tmp_path / "src").rglob("*") if p.is_file()):
        source.put(path.relative_to(tmp_path / "src").as_posix(), path.read_bytes())
    remote = pack(src_url, s3_root, opts, quiet=True, executor=executor, storage_options=options)
    out = open_store(s3_root, storage_options=options)
    packed = {key: out.read(key) for key in out.list_keys() if key != "manifest.json"}
    local_files = (p for p in (tmp_path / "local").rglob("*") if p.is_file() and p.name != "manifest.json")
    assert packed == {p.relative_to(tmp_path / "local").as_posix(): p.read_bytes() for p in local_files}
    assert remote.manifest.splits == local.manifest.splits


def test_a_pack_with_a_map_on_ray_equals_the_local_pack(
    executor: RayExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Map tasks and the shard writes of their outputs run as Ray tasks: the same bytes as local processes,
    with the map's pieces staged through OUT (several pieces per shard and shards across pieces)."""
    monkeypatch.setattr(map_pieces, "MIN_PIECES", 20)  # planned in the driver: the tasks get the pieces
    make_tree(tmp_path / "src", 40)
    opts = PackOptions(format="tfrecord", max_samples=12, map="tests.maps:twice", on_error="skip")
    local = pack(tmp_path / "src", tmp_path / "local", opts, quiet=True)
    on_ray = pack(tmp_path / "src", tmp_path / "ray", opts, quiet=True, executor=executor)
    files = {
        p.relative_to(tmp_path / "local"): p.read_bytes()
        for p in (tmp_path / "local").rglob("*")
        if p.is_file()
    }
    assert files == {
        p.relative_to(tmp_path / "ray"): p.read_bytes() for p in (tmp_path / "ray").rglob("*") if p.is_file()
    }
    assert (
        on_ray.manifest == local.manifest and sum(s.num_samples for s in local.manifest.splits["train"]) == 80
    )


def test_a_compressed_pack_on_ray_equals_the_local_pack(executor: RayExecutor, tmp_path: Path) -> None:
    """The dictionaries are trained in the driver from a sample fixed by the plan: Ray tasks compress
    with the same ones, and the shards, dictionaries and manifest are the local pack's bytes."""
    make_tree(tmp_path / "src", 40, fields=("json", "txt"))
    opts = PackOptions(format="lmdb", max_samples=12, compress="zstd:3")
    local = pack(tmp_path / "src", tmp_path / "local", opts, quiet=True)
    on_ray = pack(tmp_path / "src", tmp_path / "ray", opts, quiet=True, executor=executor)
    assert {
        p.relative_to(tmp_path / "local"): p.read_bytes()
        for p in (tmp_path / "local").rglob("*")
        if p.is_file()
    } == {
        p.relative_to(tmp_path / "ray"): p.read_bytes() for p in (tmp_path / "ray").rglob("*") if p.is_file()
    }
    assert on_ray.manifest == local.manifest and set(local.manifest.compression) == {"json", "txt"}
