"""RayExecutor on a real two-node cluster (127.0.0.1): tasks spread over both nodes, the node-named path
check, and the pack's units run as Ray tasks giving shards byte-identical to a local ``pack()``, also
when a worker is killed mid-pack.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from shardpipe.errors import DataError
from shardpipe.formats import get_format
from shardpipe.manifest import MANIFEST_NAME, load_manifest
from shardpipe.packing import PackOptions, pack
from shardpipe.packing.plan import ShardJob, plan_jobs
from shardpipe.packing.ray_engine import RayExecutor, check_visible
from shardpipe.packing.shard_writing import write_shard
from shardpipe.shardtable import ShardEntry
from shardpipe.sources import SampleTable, scan_source
from shardpipe.storage import Store, open_store
from testkit.ray_cluster import Cluster, token_auth, two_node_cluster
from tests.datagen import make_tree

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]
WAIT_S = 90.0
FORMATS = ["tar", "lmdb", "tfrecord"]


def node_after(seconds: float) -> str:
    """The Ray node this task ran on, after holding its CPU a while (so a second task needs another)."""
    import ray

    time.sleep(seconds)
    node: str = ray.get_runtime_context().get_node_id()
    return node


def write_shard_killed_once(folder: str, job: ShardJob, out: Store, format_name: str) -> ShardEntry:
    """``write_shard``, except that the first attempt at the first shard blocks until the test kills it."""
    if job.relpath.endswith("shard-000000.tar"):
        try:
            fd = os.open(Path(folder) / "victim.pid", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass  # the retry
        else:
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            time.sleep(WAIT_S * 3)
    return write_shard(job, out, format_name)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with token_auth(), two_node_cluster() as started:
        yield started


@pytest.fixture(scope="module")
def engine(cluster: Cluster) -> Iterator[RayExecutor]:
    executor = RayExecutor(address=cluster.address, max_workers=2)
    try:
        deadline = time.monotonic() + WAIT_S
        while len(alive_nodes()) < 2:
            assert time.monotonic() < deadline, "the second node never joined"
            time.sleep(0.2)
        yield executor
    finally:
        executor.shutdown()


def alive_nodes() -> set[str]:
    import ray

    listing: Any = ray.nodes  # unannotated
    return {n["NodeID"] for n in listing() if n["Alive"]}


def test_tasks_run_on_both_nodes(engine: RayExecutor) -> None:
    # One CPU per node and one per task: two tasks at once can only run on two nodes.
    nodes = [f.result(timeout=WAIT_S) for f in [engine.submit(node_after, 0.5) for _ in range(6)]]
    assert set(nodes) == alive_nodes()
    assert len(set(nodes)) == 2


def test_missing_path_names_the_node(engine: RayExecutor, tmp_path: Path) -> None:
    missing = str(tmp_path / "only-on-the-driver")
    with pytest.raises(DataError) as caught:
        engine.submit(check_visible, [missing]).result(timeout=WAIT_S)
    message = str(caught.value)
    assert missing in message and "shared mount" in message
    named = message.split("Ray node ", 1)[1][:12]
    assert any(node.startswith(named) for node in alive_nodes()), message


def shard_files(out: Path) -> dict[str, bytes]:
    """Every file a pack leaves in OUT except the manifest, which the driver writes (tested with pack)."""
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }


def same_table(a: SampleTable, b: SampleTable) -> bool:
    return (a.keys, a.fields, a.columns, a.sizes.tolist()) == (b.keys, b.fields, b.columns, b.sizes.tolist())


def pack_on_ray(
    engine: RayExecutor, src: Path, out: Path, options: PackOptions, folder: str | None = None
) -> list[ShardEntry]:
    """The engine seam by hand: scan and write on Ray, plan in the driver; the entries in plan order."""
    scan = scan_source(src, labels=options.labels, pool=engine)
    jobs = plan_jobs(scan.table, get_format(options.format).suffix, options)
    out.mkdir()
    store = open_store(out)
    if folder is None:
        futures = [engine.submit(write_shard, job, store, options.format) for job in jobs]
    else:
        futures = [engine.submit(write_shard_killed_once, folder, job, store, options.format) for job in jobs]
    return [f.result(timeout=WAIT_S * 2) for f in futures]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("ray-pack") / "src"
    make_tree(src, 90, classes=3, size=300)
    return src


@pytest.mark.parametrize("fmt", FORMATS)
def test_shards_written_on_ray_are_byte_identical(
    engine: RayExecutor, source: Path, tmp_path: Path, fmt: str
) -> None:
    options = PackOptions(format=fmt, split={"train": 0.8, "val": 0.2}, max_samples=8, labels="dirname")
    local = pack(source, tmp_path / "local", options, quiet=True)
    local_entries = {e.path: e for shards in local.manifest.splits.values() for e in shards}

    assert same_table(scan_source(source, pool=engine).table, scan_source(source).table)
    entries = pack_on_ray(engine, source, tmp_path / "ray", options)
    assert {e.path: e for e in entries} == local_entries
    assert shard_files(tmp_path / "ray") == shard_files(tmp_path / "local")
    assert len(entries) > 4  # enough shards to spread over both nodes and both slots


def test_killed_worker_mid_pack_still_byte_identical(
    engine: RayExecutor, source: Path, tmp_path: Path
) -> None:
    options = PackOptions(format="tar", max_samples=8, labels="dirname")
    pack(source, tmp_path / "local", options, quiet=True)
    folder = tmp_path / "marks"
    folder.mkdir()

    killed: list[str] = []

    def kill_the_victim() -> None:
        victim = folder / "victim.pid"
        deadline = time.monotonic() + WAIT_S
        while not (victim.exists() and victim.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if victim.exists():
            process = psutil.Process(int(victim.read_text()))
            killed.append(process.name())
            process.send_signal(signal.SIGKILL)

    killer = threading.Thread(target=kill_the_victim)
    killer.start()
    entries = pack_on_ray(engine, source, tmp_path / "ray", options, str(folder))
    killer.join()
    assert len(killed) == 1 and killed[0].startswith("ray::"), killed  # a Ray worker, mid-task
    assert {e.path: e for e in entries} == {
        e.path: e for e in load_manifest(tmp_path / "local").splits["train"]
    }
    assert shard_files(tmp_path / "ray") == shard_files(tmp_path / "local")
