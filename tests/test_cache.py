"""The verified per-node shard cache against the loopback S3 server."""

from __future__ import annotations

import faulthandler
import fcntl
import hashlib
import multiprocessing as mp
import os
import queue
import random
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from loaders.cache.directory import LAYOUT, default_cache_dir, flocked
from loaders.cache.shard_cache import ShardCache, ShardRef
from shardpipe.errors import CorruptShardError, DataError, UsageError
from shardpipe.storage import RetryPolicy, open_store
from shardpipe.units import parse_size
from testkit.servers import Faults, S3Server

CHILD_TIMEOUT_S = 60


def upload_shards(s3: S3Server, root: str, sizes: list[int], seed: int = 0) -> list[tuple[ShardRef, bytes]]:
    """Random shards of the given sizes under ``root``; their refs and bytes."""
    rng = random.Random(seed)
    store = open_store(root, storage_options=s3.storage_options())
    shards = []
    for i, size in enumerate(sizes):
        data = rng.randbytes(size)
        path = f"train/shard-{i:04d}.tar"
        store.put(path, data)
        shards.append((ShardRef(path, hashlib.sha256(data).hexdigest(), size), data))
    return shards


def folder_bytes(root: Path) -> int:
    """Bytes of shards and reservations in the cache under ``root``, listed under the cache's budget lock,
    where it evicts, reserves and renames downloads into place, so the listing sees one state."""
    lock = root / LAYOUT / "budget.lock"
    if not lock.parent.is_dir():
        return 0
    with flocked(lock, fcntl.LOCK_EX):
        return sum(path.stat().st_size for path in root.rglob("objects/*"))


def make_cache(s3: S3Server, root: str, tmp_path: Path, **kw: Any) -> ShardCache:
    return ShardCache(root, cache_dir=tmp_path / "cache", storage_options=s3.storage_options(), **kw)


def test_local_serves_a_verified_copy_and_downloads_it_once(
    s3: S3Server, s3_root: str, tmp_path: Path
) -> None:
    ((ref, data),) = upload_shards(s3, s3_root, [50_000])
    s3.control.reset_counts()
    with make_cache(s3, s3_root, tmp_path, prefetch=0) as cache:
        for _ in range(3):
            with cache.local(ref.path, ref.sha256, ref.num_bytes) as path:
                assert path.read_bytes() == data
                assert path.is_relative_to(tmp_path / "cache")
    assert s3.control.count("GET", ref.path) == 1


def test_a_local_dataset_is_read_in_place(tmp_path: Path) -> None:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds/a.tar").write_bytes(b"abc")
    cache = ShardCache(tmp_path / "ds", cache_dir=tmp_path / "cache")
    with cache.local("a.tar", hashlib.sha256(b"abc").hexdigest(), 3) as path:
        assert path == tmp_path / "ds/a.tar"
    assert not (tmp_path / "cache").exists()


def _race(root: str, options: dict[str, Any], cache_dir: str, ref: ShardRef, barrier: Any, out: Any) -> None:
    cache = ShardCache(root, cache_dir=cache_dir, storage_options=options, prefetch=0)
    barrier.wait(timeout=CHILD_TIMEOUT_S)
    with cache.local(ref.path, ref.sha256, ref.num_bytes) as path:
        out.put(hashlib.sha256(path.read_bytes()).hexdigest())


@pytest.mark.timeout(120)
def test_two_processes_racing_for_one_shard_download_it_once(
    s3: S3Server, s3_root: str, tmp_path: Path
) -> None:
    ((ref, _),) = upload_shards(s3, s3_root, [300_000])
    s3.control.reset_counts()
    s3.control.set_faults(Faults(latency_s=0.2))  # a download slow enough for the two to overlap
    context = mp.get_context("spawn")
    barrier, out = context.Barrier(2), context.Queue()
    args = (s3_root, s3.storage_options(), str(tmp_path / "cache"), ref, barrier, out)
    children = [context.Process(target=_race, args=args) for _ in range(2)]
    for child in children:
        child.start()
    try:
        digests = [out.get(timeout=CHILD_TIMEOUT_S) for _ in children]
    except queue.Empty:
        pytest.fail("a racing process did not deliver the shard in time")
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
    assert digests == [ref.sha256, ref.sha256]
    assert s3.control.count("GET", ref.path) == 1, "the shard was downloaded more than once on one node"


def test_a_corrupted_object_raises_naming_the_url_and_caches_nothing(
    s3: S3Server, s3_root: str, tmp_path: Path
) -> None:
    ((ref, _),) = upload_shards(s3, s3_root, [10_000])
    wrong = ShardRef(ref.path, hashlib.sha256(b"what the manifest says").hexdigest(), ref.num_bytes)
    cache = make_cache(s3, s3_root, tmp_path, prefetch=0)
    s3.control.reset_counts()
    with (
        pytest.raises(CorruptShardError, match=f"{s3_root}/{ref.path}.*downloaded 3 times"),
        cache.local(wrong.path, wrong.sha256, wrong.num_bytes),
    ):
        pass
    assert s3.control.count("GET", ref.path) == 3
    assert list((tmp_path / "cache/v1/objects").iterdir()) == []


def test_a_download_damaged_once_is_retried_and_served(s3: S3Server, s3_root: str, tmp_path: Path) -> None:
    ((ref, data),) = upload_shards(s3, s3_root, [10_000])
    cache = make_cache(s3, s3_root, tmp_path, prefetch=0)
    real = cache.store.iter_chunks
    calls = []

    def damaged_once(key: str, size: int, chunk_size: int = 1 << 20) -> Any:
        calls.append(key)
        for chunk in real(key, size):
            yield chunk if len(calls) > 1 else bytes(len(chunk))

    cache.store.iter_chunks = damaged_once  # type: ignore[method-assign]
    with cache.local(ref.path, ref.sha256, ref.num_bytes) as path:
        assert path.read_bytes() == data
    assert len(calls) == 2


def test_a_download_renamed_into_place_while_the_budget_is_counted_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Space is counted by listing the folder and then looking at each file: a rename in between would
    hide a shard from the count, and the next reservation would overrun the budget by it. The rename
    happens under the budget lock, so it waits for the count."""
    from loaders.cache import directory as cachedir

    directory = cachedir.CacheDir(tmp_path, limit=100)
    first, second = "a" * 64, "b" * 64
    temp = directory.reserve(first, 60, dict, needed_in=0.0)
    assert temp is not None
    real_scandir = os.scandir
    published = threading.Thread(target=directory.publish, args=(temp, first))

    def scandir_then_publish(path: Any) -> Any:
        entries = list(real_scandir(path))
        if sys._getframe(1).f_code.co_name == "usage" and not published.is_alive():
            published.start()  # between the listing and the look at each file
            published.join(timeout=0.5)
        return iter(entries)

    with directory.fetching(first):  # its download is in progress, as the cache holds it
        monkeypatch.setattr(cachedir.os, "scandir", scandir_then_publish)
        reserved = directory.reserve(second, 60, dict, needed_in=0.0)
        published.join()
        monkeypatch.undo()
    assert reserved is None  # no room: the first shard's 60 bytes counted, and not evictable mid-publish
    assert directory.final(first).stat().st_size == 60
    assert directory.usage() <= 100


@pytest.mark.timeout(120)
def test_a_budget_below_the_dataset_is_never_exceeded_and_still_delivers(
    s3: S3Server, s3_root: str, tmp_path: Path
) -> None:
    shards = upload_shards(s3, s3_root, [30_000 + 1000 * i for i in range(8)])
    limit = 3 * 40_000
    order = [i for epoch in range(2) for i in random.Random(epoch).sample(range(8), 8)]
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.wait(0.001):  # a pause between listings, which hold the cache's budget lock
            peak[0] = max(peak[0], folder_bytes(tmp_path / "cache"))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with make_cache(s3, s3_root, tmp_path, cache_limit=limit, prefetch=2) as cache:
            cache.plan([shards[i][0] for i in order])
            for i in order:
                ref, data = shards[i]
                with cache.local(ref.path, ref.sha256, ref.num_bytes) as path:
                    assert path.read_bytes() == data
                    peak[0] = max(peak[0], folder_bytes(tmp_path / "cache"))
    finally:
        stop.set()
        watcher.join()
    assert 0 < peak[0] <= limit
    assert sum(len(d) for _, d in shards) > limit  # the test means something only if the data does not fit


def test_a_budget_below_one_shard_is_refused(s3: S3Server, s3_root: str, tmp_path: Path) -> None:
    ((ref, _),) = upload_shards(s3, s3_root, [5_000])
    cache = make_cache(s3, s3_root, tmp_path, cache_limit="4KB")
    refused = r"cache_limit 4000 bytes is smaller than shard train/shard-0000\.tar"
    with pytest.raises(UsageError, match=refused):
        cache.plan([ref])
    with (
        pytest.raises(UsageError, match="smaller than shard"),
        cache.local(ref.path, ref.sha256, ref.num_bytes),
    ):
        pass


def test_eviction_picks_the_shard_used_furthest_in_the_future(
    s3: S3Server, s3_root: str, tmp_path: Path
) -> None:
    shards = upload_shards(s3, s3_root, [10_000] * 4)
    a, b, c, d = (ref for ref, _ in shards)
    with make_cache(s3, s3_root, tmp_path, cache_limit=30_000, prefetch=0) as cache:
        cache.plan([a, b, c, d, b, a, c])
        for ref in (a, b, c, d):  # at d the cache holds a, b, c: next uses b in 1, a in 2, c in 3
            with cache.local(ref.path, ref.sha256, ref.num_bytes):
                pass
        present = {ref.path for ref in (a, b, c, d) if cache.directory.final(ref.sha256).exists()}
    assert present == {a.path, b.path, d.path}


def test_a_shard_being_read_is_not_evicted(s3: S3Server, s3_root: str, tmp_path: Path) -> None:
    shards = upload_shards(s3, s3_root, [10_000] * 3)
    a, b, c = (ref for ref, _ in shards)
    cache = make_cache(s3, s3_root, tmp_path, cache_limit=20_000, prefetch=0, wait_timeout_s=0.5)
    cache.plan([a, b, c])
    with cache.local(a.path, a.sha256, a.num_bytes), cache.local(b.path, b.sha256, b.num_bytes):
        with pytest.raises(DataError, match="no room in cache"), cache.local(c.path, c.sha256, c.num_bytes):
            pass
        assert cache.directory.final(a.sha256).exists() and cache.directory.final(b.sha256).exists()
    with cache.local(c.path, c.sha256, c.num_bytes) as path:  # once they are released, c fits
        assert path.stat().st_size == 10_000
    assert cache.usage() <= 20_000


def test_prefetch_fetches_the_next_shards_of_the_plan(s3: S3Server, s3_root: str, tmp_path: Path) -> None:
    shards = upload_shards(s3, s3_root, [10_000] * 4)
    refs = [ref for ref, _ in shards]
    with make_cache(s3, s3_root, tmp_path, prefetch=2) as cache:
        cache.plan(refs)
        with cache.local(refs[0].path, refs[0].sha256, refs[0].num_bytes):
            cache.wait_prefetched(timeout=30)
        cached = [cache.directory.final(ref.sha256).exists() for ref in refs]
    assert cached == [True, True, True, False]


def test_prefetch_passes_over_shards_cached_or_being_fetched_elsewhere(
    s3: S3Server, s3_root: str, tmp_path: Path
) -> None:
    """Readers of one node read many shards in the same order: a prefetch passes over cached shards to the
    next ones, and leaves a shard another process is fetching to it instead of waiting behind it."""
    shards = upload_shards(s3, s3_root, [10_000] * 6)
    refs = [ref for ref, _ in shards]
    with make_cache(s3, s3_root, tmp_path, prefetch=2) as cache:
        with cache.local(refs[1].path, refs[1].sha256, refs[1].num_bytes):  # cached already
            pass
        lock = cache.directory.locks / f"{refs[2].sha256}.fetch"
        with flocked(lock, fcntl.LOCK_EX):  # another process is fetching shard 2
            cache.plan([refs[0], refs[1], refs[1], refs[2], refs[3], refs[4], refs[5]])
            with cache.local(refs[0].path, refs[0].sha256, refs[0].num_bytes):
                cache.wait_prefetched(timeout=30)
            cached = [cache.directory.final(ref.sha256).exists() for ref in refs]
    assert cached == [True, True, False, True, False, False]


def _hold_lock_and_reservation(cache_dir: str, sha256: str, ready: Any) -> None:
    from loaders.cache.directory import CacheDir

    directory = CacheDir(Path(cache_dir), None)
    with directory.fetching(sha256):
        directory.reserve(sha256, 10_000, dict, needed_in=0.0)
        ready.set()
        threading.Event().wait(CHILD_TIMEOUT_S)  # until killed


@pytest.mark.timeout(120)
def test_a_killed_process_holding_a_lock_does_not_block_others(
    s3: S3Server, s3_root: str, tmp_path: Path
) -> None:
    ((ref, data),) = upload_shards(s3, s3_root, [10_000])
    context = mp.get_context("spawn")
    ready = context.Event()
    child = context.Process(
        target=_hold_lock_and_reservation, args=(str(tmp_path / "cache"), ref.sha256, ready)
    )
    child.start()
    try:
        assert ready.wait(CHILD_TIMEOUT_S), "the lock holder did not start"
        lock = tmp_path / "cache/v1/locks" / f"{ref.sha256}.fetch"
        with flocked(lock, fcntl.LOCK_EX | fcntl.LOCK_NB) as free:
            assert not free, "the child should hold the fetch lock while alive"
        os.kill(child.pid or 0, signal.SIGKILL)
    finally:
        child.join(timeout=10)
    cache = make_cache(s3, s3_root, tmp_path, cache_limit=15_000, prefetch=0, wait_timeout_s=30)
    with cache.local(ref.path, ref.sha256, ref.num_bytes) as path:
        assert path.read_bytes() == data
    assert cache.usage() == 10_000, "the dead process's reservation was not swept"


def _read_with_inherited_cache(cache: ShardCache, ref: ShardRef, out: Any) -> None:
    faulthandler.dump_traceback_later(CHILD_TIMEOUT_S / 2)  # a hang shows where the child waits
    with cache.local(ref.path, ref.sha256, ref.num_bytes) as path:
        out.put(hashlib.sha256(path.read_bytes()).hexdigest())


def _take_lock(path: Path, out: Any) -> None:
    with flocked(path, fcntl.LOCK_EX):
        out.put("taken")


@pytest.mark.timeout(60)
def test_a_child_forked_while_another_thread_holds_a_lock_can_take_it_once_released(tmp_path: Path) -> None:
    """The child's copy of the holder's descriptor is closed at the fork, so only the parent's release
    counts: without that the child waits forever on a lock its own inherited copy holds."""
    path = tmp_path / "shard.fetch"
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with flocked(path, fcntl.LOCK_EX):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(30)
    context = mp.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_take_lock, args=(path, out))
    child.start()  # forked while the holder thread has the lock
    try:
        with pytest.raises(queue.Empty):
            out.get(timeout=0.5)  # the parent still holds it
        release.set()
        holder.join(30)
        assert out.get(timeout=20) == "taken"
    finally:
        release.set()
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_cache_in_use_crosses_fork_and_spawn(
    method: str, s3: S3Server, s3_root: str, tmp_path: Path
) -> None:
    shards = upload_shards(s3, s3_root, [10_000] * 3)
    refs = [ref for ref, _ in shards]
    cache = make_cache(s3, s3_root, tmp_path, prefetch=2)
    cache.plan(refs)
    with cache.local(refs[0].path, refs[0].sha256, refs[0].num_bytes):  # pool and event loop live now
        pass
    context = mp.get_context(method)
    out = context.Queue()
    child = context.Process(target=_read_with_inherited_cache, args=(cache, refs[2], out))
    child.start()
    try:
        assert out.get(timeout=CHILD_TIMEOUT_S) == refs[2].sha256
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
        cache.close()
    assert child.exitcode == 0


def test_parse_size_and_cache_folder_rules(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert parse_size("50GB") == 50 * 10**9
    assert parse_size("1.5 GiB") == int(1.5 * 2**30)
    assert parse_size(4096) == 4096
    for bad in ("lots", "5 parsecs", 0, "-3MB"):
        with pytest.raises(UsageError):
            parse_size(bad)  # type: ignore[arg-type]
    monkeypatch.setenv("SHARDPIPE_CACHE", str(tmp_path / "from-env"))
    assert default_cache_dir() == tmp_path / "from-env"
    monkeypatch.delenv("SHARDPIPE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg/shardpipe"
    with pytest.raises(UsageError, match="prefetch must be >= 0 shards, got -1"):
        ShardCache("s3://b/x", prefetch=-1)


@pytest.mark.timeout(120)
def test_reads_through_the_cache_survive_a_tenth_of_requests_failing(
    s3: S3Server, s3_root: str, tmp_path: Path
) -> None:
    shards = upload_shards(s3, s3_root, [20_000] * 6)
    s3.control.reset_counts()
    s3.control.set_faults(Faults(rate=0.1, seed=15, slow_s=0.8))  # seed 15: faults in the first 4
    retry = RetryPolicy(
        max_attempts=8, backoff_s=0.01, max_backoff_s=0.05, read_timeout_s=0.4, operation_timeout_s=4
    )
    with make_cache(s3, s3_root, tmp_path, prefetch=2, retry=retry) as cache:
        cache.plan([ref for ref, _ in shards])
        for ref, data in shards:
            with cache.local(ref.path, ref.sha256, ref.num_bytes) as path:
                assert path.read_bytes() == data
    assert s3.control.injected >= 2, "too few faults were injected for the test to mean anything"


def test_eviction_weighs_every_live_reader_on_the_node(s3: S3Server, s3_root: str, tmp_path: Path) -> None:
    shards = upload_shards(s3, s3_root, [10_000] * 4)
    a1, a2, a3, b1 = (ref for ref, _ in shards)
    reader_a = make_cache(s3, s3_root, tmp_path, cache_limit=30_000, prefetch=0)
    reader_b = make_cache(s3, s3_root, tmp_path, cache_limit=30_000, prefetch=0)
    reader_b.plan([b1, a3, b1])  # b reads b1 now and again two shards later
    with reader_b.local(b1.path, b1.sha256, b1.num_bytes):
        pass
    reader_a.plan([a1, a2, a3])
    for ref in (a1, a2, a3):  # at a3 the cache holds b1, a1, a2: only b1 is used again (by b)
        with reader_a.local(ref.path, ref.sha256, ref.num_bytes):
            pass
    assert reader_a.directory.final(b1.sha256).exists(), "a evicted the shard b reads next"
    assert reader_a.usage() <= 30_000
    reader_b.close()  # b's plan is withdrawn: b1 is now just the oldest shard nobody plans to read
    reader_a.plan([a1, a2, a3])  # a1 was evicted at a3; fetching it again must now evict b1
    with reader_a.local(a1.path, a1.sha256, a1.num_bytes):
        pass
    present = {ref.path for ref in (a1, a2, a3, b1) if reader_a.directory.final(ref.sha256).exists()}
    assert present == {a1.path, a2.path, a3.path}
    reader_a.close()


def _plan_and_die(
    root: str, options: dict[str, Any], cache_dir: str, refs: list[ShardRef], ready: Any
) -> None:
    cache = ShardCache(root, cache_dir=cache_dir, cache_limit=30_000, storage_options=options, prefetch=0)
    cache.plan(refs)
    ready.set()
    threading.Event().wait(CHILD_TIMEOUT_S)  # until killed


@pytest.mark.timeout(120)
def test_the_plan_of_a_killed_reader_stops_counting(s3: S3Server, s3_root: str, tmp_path: Path) -> None:
    shards = upload_shards(s3, s3_root, [10_000] * 2)
    context = mp.get_context("spawn")
    ready = context.Event()
    args = (s3_root, s3.storage_options(), str(tmp_path / "cache"), [shards[0][0]], ready)
    child = context.Process(target=_plan_and_die, args=args)
    child.start()
    try:
        assert ready.wait(CHILD_TIMEOUT_S), "the planning process did not start"
        cache = make_cache(s3, s3_root, tmp_path, cache_limit=30_000)
        assert cache.node_plans.next_uses() == {shards[0][0].sha256: 0}
        os.kill(child.pid or 0, signal.SIGKILL)
    finally:
        child.join(timeout=10)
    assert cache.node_plans.next_uses() == {}
    assert list((tmp_path / "cache/v1/plans").iterdir()) == []
