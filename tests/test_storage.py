"""The storage seam against a local folder, loopback S3 (moto) and a loopback Range-capable HTTP server."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import queue
from pathlib import Path
from typing import Any, cast

import gcsfs
import pytest

from shardpipe.errors import CorruptShardError, UsageError
from shardpipe.storage import (
    AccessDeniedError,
    ObjectNotFoundError,
    RetryPolicy,
    StorageUnavailableError,
    Store,
    join_key,
    open_store,
    read_ranges,
    redact_url,
    scrub,
    split_url,
)
from shardpipe.storage.local import LocalStore
from shardpipe.storage.remote import MAX_CONNECTIONS, FsspecStore
from testkit.servers import Faults, HTTPServer, S3Server

PAYLOAD = bytes(range(256)) * 64  # 16 KiB, every byte value at every offset mod 256
#: Short timeouts so an injected slow answer becomes a timeout, and quick backoff, for the fault tests.
FAST_RETRY = RetryPolicy(
    max_attempts=8, backoff_s=0.01, max_backoff_s=0.05, read_timeout_s=0.4, operation_timeout_s=4
)

S3 = pytest.param("s3", marks=pytest.mark.s3)  # the loopback servers: not in make test-fast
HTTP = pytest.param("http", marks=pytest.mark.s3)


def make_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    """A store of ``kind`` holding ``a/one.bin`` (PAYLOAD) and ``a/b/two.bin`` (b"two")."""
    if kind == "local":
        store: Store = open_store(tmp_path / "root")
    elif kind == "s3":
        s3: S3Server = request.getfixturevalue("s3")
        store = open_store(request.getfixturevalue("s3_root"), storage_options=s3.storage_options())
    else:
        folder, url = request.getfixturevalue("http_dir")
        (folder / "a/b").mkdir(parents=True)
        (folder / "a/one.bin").write_bytes(PAYLOAD)
        (folder / "a/b/two.bin").write_bytes(b"two")
        return open_store(url)
    store.put("a/one.bin", PAYLOAD)
    store.put("a/b/two.bin", b"two")
    return store


@pytest.mark.parametrize(
    "kind", ["local", pytest.param("s3", marks=pytest.mark.s3), pytest.param("http", marks=pytest.mark.s3)]
)
def test_read_operations(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    store = make_store(kind, tmp_path, request)
    assert store.exists("a/one.bin") and not store.exists("a/missing.bin")
    assert store.size("a/one.bin") == len(PAYLOAD)
    assert store.read("a/b/two.bin") == b"two"
    assert store.read_range("a/one.bin", 300, 310) == PAYLOAD[300:310]
    wanted = [(5000, 5100), (0, 10), (10, 20), (16000, 16384), (7, 7)]
    assert store.read_ranges("a/one.bin", wanted) == [PAYLOAD[s:e] for s, e in wanted]
    with store.open("a/one.bin") as f:
        f.seek(1000)
        assert f.read(24) == PAYLOAD[1000:1024]
    assert store.list_keys("a") == ["a/b/two.bin", "a/one.bin"]
    assert store.list_sizes("a") == {"a/b/two.bin": 3, "a/one.bin": len(PAYLOAD)}
    assert store.sha256("a/one.bin") == (hashlib.sha256(PAYLOAD).hexdigest(), len(PAYLOAD))
    assert b"".join(store.iter_chunks("a/one.bin", len(PAYLOAD), chunk_size=5000)) == PAYLOAD
    assert (store.local_path("a/one.bin") is not None) == (kind == "local")
    assert read_ranges(store.url("a/one.bin"), [(1, 3)], storage_options=_options(kind, request)) == [
        PAYLOAD[1:3]
    ]


def _options(kind: str, request: pytest.FixtureRequest) -> dict[str, Any] | None:
    return request.getfixturevalue("s3").storage_options() if kind == "s3" else None


@pytest.mark.parametrize("kind", ["local", S3])
def test_put_remove_and_put_file(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    store = make_store(kind, tmp_path, request)
    source = tmp_path / "src.bin"
    source.write_bytes(PAYLOAD * 3)
    digest = store.put_file("c/big.bin", source)
    assert digest == hashlib.sha256(PAYLOAD * 3).hexdigest()
    assert store.read("c/big.bin") == PAYLOAD * 3
    with pytest.raises(CorruptShardError):
        store.put("c/bad.bin", b"abc", sha256="0" * 64)
    assert not store.exists("c/bad.bin")
    store.remove("c/big.bin")
    assert not store.exists("c/big.bin")
    store.remove("c/big.bin")  # missing_ok by default
    with pytest.raises(ObjectNotFoundError):
        store.remove("c/big.bin", missing_ok=False)


def test_local_store_takes_no_fsspec_path(tmp_path: Path) -> None:
    assert isinstance(open_store(tmp_path), LocalStore)
    assert isinstance(open_store(f"file://{tmp_path}"), LocalStore)
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    with pytest.raises(UsageError, match="unsupported URL scheme 'ftp'"):
        open_store("ftp://host/x")


def test_local_put_leaves_nothing_partial_when_the_rename_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path)
    store.put("x.bin", b"old")

    def fail(*_: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk gone"):
        store.put("x.bin", b"new content")
    assert (tmp_path / "x.bin").read_bytes() == b"old"
    with pytest.raises(OSError, match="disk gone"):
        store.put("y.bin", b"new content")
    assert not (tmp_path / "y.bin").exists()


def test_s3_upload_damaged_in_transit_is_removed_and_raises(s3: S3Server, s3_root: str) -> None:
    store = open_store(s3_root, storage_options=s3.storage_options())
    assert isinstance(store, FsspecStore)
    real = store.fs.pipe_file
    sent: list[bytes] = []

    def damaged(path: str, data: bytes, **kw: Any) -> Any:
        sent.append(data)
        return real(path, data[:-1] + bytes([data[-1] ^ 1]), **kw)

    store.fs.pipe_file = damaged
    with pytest.raises(CorruptShardError, match="uploaded 3 times"):
        store.put("shard.tar", PAYLOAD)
    assert len(sent) == 3
    assert not store.exists("shard.tar")
    store.fs.pipe_file = real
    store.put("shard.tar", PAYLOAD)
    assert store.read("shard.tar") == PAYLOAD


@pytest.mark.parametrize(
    "kind", [pytest.param("s3", marks=pytest.mark.s3), pytest.param("http", marks=pytest.mark.s3)]
)
def test_reads_succeed_under_a_tenth_of_requests_failing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = make_store(kind, tmp_path, request)
    server: S3Server | HTTPServer = request.getfixturevalue(kind if kind == "s3" else "http")
    store = open_store(store.root, storage_options=_options(kind, request), retry=FAST_RETRY)
    server.control.set_faults(Faults(rate=0.1, seed=7, slow_s=0.8))
    for i in range(40):
        start = (i * 397) % len(PAYLOAD)
        assert store.read_range("a/one.bin", start, start + 100) == PAYLOAD[start : start + 100]
    assert store.read("a/one.bin") == PAYLOAD
    if kind == "s3":
        for i in range(5):
            store.put(f"w/{i}.bin", PAYLOAD[i:])
            assert store.read(f"w/{i}.bin") == PAYLOAD[i:]
    assert server.control.injected >= 4, "the fault switch injected fewer faults than the test relies on"


def test_persistent_failure_names_the_url_after_the_retry_limit(
    http_dir: tuple[Path, str], http: HTTPServer
) -> None:
    folder, url = http_dir
    (folder / "x.bin").write_bytes(b"x")
    http.control.set_faults(Faults(rate=1.0, kinds=("500",)))
    store = open_store(url, retry=RetryPolicy(max_attempts=3, backoff_s=0.01, max_backoff_s=0.01))
    with pytest.raises(
        StorageUnavailableError, match=rf"{url}/x.bin still failing after the retry limit \(3 attempts\)"
    ):
        store.read("x.bin")
    assert http.control.count("GET", "/x.bin") == 3


SECRET = "sEcReT-vAlUe-1234"


def test_s3_403_and_404_fail_at_once_naming_the_url_without_secrets(s3: S3Server, s3_root: str) -> None:
    store = open_store(s3_root, storage_options=s3.storage_options(token=SECRET))  # moto ignores it
    with pytest.raises(ObjectNotFoundError) as missing:
        store.read("nothing/here.tar")
    assert f"{s3_root}/nothing/here.tar" in str(missing.value) and "404" in str(missing.value)
    assert "testing-secret-value" not in str(missing.value) and SECRET not in str(missing.value)
    with pytest.raises(AccessDeniedError, match="check the credentials") as denied:
        store.size("forbidden/x.tar")
    assert f"{s3_root}/forbidden/x.tar" in str(denied.value)
    for secret in ("testing-secret-value", "testing-key-id", SECRET):
        assert secret not in str(denied.value)
    assert s3.control.count("HEAD", "/forbidden/x.tar") == 1, "a 403 was retried"
    assert s3.control.count("GET", "/nothing/here.tar") <= 1, "a 404 was retried"


def test_http_403_and_404_fail_at_once_without_credentials_or_query(
    http_dir: tuple[Path, str], http: HTTPServer
) -> None:
    _, url = http_dir
    host_part = url.removeprefix("http://")
    store = open_store(f"http://user:{SECRET}@{host_part}")
    with pytest.raises(ObjectNotFoundError) as missing:
        store.read("nope.bin")
    assert f"{url}/nope.bin" in str(missing.value) and SECRET not in str(missing.value)
    with pytest.raises(AccessDeniedError) as denied:
        read_ranges(f"{url}/forbidden/a.bin?token={SECRET}", [(0, 4)])
    assert f"{url}/forbidden/a.bin" in str(denied.value) and SECRET not in str(denied.value)
    assert http.control.count("GET", "/nope.bin") == 1
    assert http.control.count("GET", "/forbidden/a.bin") == 1


def test_redaction_helpers() -> None:
    assert (
        redact_url(f"https://u:{SECRET}@host:9/p/q.tar?X-Amz-Signature={SECRET}#f")
        == "https://host:9/p/q.tar"
    )
    assert redact_url("/plain/path") == "/plain/path"
    text = f"failed GET s3://b/k?sig={SECRET} with key {SECRET}"
    assert SECRET not in scrub(text, {"client_kwargs": {"aws_secret_access_key": SECRET}})
    assert split_url("s3://b/dir/manifest.json") == ("s3://b/dir", "manifest.json")
    assert split_url("https://h/d/manifest.json?sig=1") == ("https://h/d", "manifest.json")
    assert split_url("/x/y/manifest.json") == ("/x/y", "manifest.json")
    assert join_key("a/", "/b", "", "c.tar") == "a/b/c.tar"


def test_read_ranges_fetches_neighbours_in_one_request(s3: S3Server, s3_root: str) -> None:
    store = open_store(s3_root, storage_options=s3.storage_options())
    store.put("s.bin", PAYLOAD)
    s3.control.reset_counts()
    wanted = [(0, 100), (150, 300), (400, 512)]
    assert store.read_ranges("s.bin", wanted) == [PAYLOAD[s:e] for s, e in wanted]
    assert s3.control.count("GET", "/s.bin") == 1


def _read_in_child(store: Store, results: Any) -> None:
    assert isinstance(store, FsspecStore)
    inherited = store._fs  # the parent's, copied by a fork
    data = store.read("a/one.bin")
    results.put((data == PAYLOAD, store._pid == os.getpid(), store._fs is not inherited))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_store_is_safe_across_fork_and_spawn(
    method: str, s3: S3Server, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = make_store("s3", tmp_path, request)
    assert store.read("a/one.bin") == PAYLOAD  # the parent's event loop and connection pool are live now
    context = mp.get_context(method)
    results = context.Queue()
    children = [context.Process(target=_read_in_child, args=(store, results)) for _ in range(2)]
    for child in children:
        child.start()
    try:
        got = [results.get(timeout=45) for _ in children]
    except queue.Empty:
        pytest.fail(
            f"a child under {method} did not read within 45 s (a filesystem object crossed the fork?)"
        )
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
    assert got == [(True, True, True), (True, True, True)]
    assert all(child.exitcode == 0 for child in children)
    assert store.read("a/one.bin") == PAYLOAD  # the parent's own filesystem still works


def test_retry_policy_validates() -> None:
    with pytest.raises(UsageError, match="max_attempts must be >= 1, got 0"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(UsageError, match="read_timeout_s must be > 0"):
        RetryPolicy(read_timeout_s=0)


def test_stores_with_equal_options_share_one_filesystem() -> None:
    """A client costs far more to build than a request: the stores of one process with equal options (a
    dataset's splits, its cache, pack tasks) share one; other options get their own."""
    options = {"token": "anon"}
    first = open_store("gs://bucket/a", storage_options=options)
    assert isinstance(first, FsspecStore)
    assert cast(FsspecStore, open_store("gs://bucket/b", storage_options=dict(options))).fs is first.fs
    other = cast(FsspecStore, open_store("gs://bucket/a", storage_options={**options, "project": "p"}))
    assert other.fs is not first.fs


def test_s3_stores_keep_a_batch_of_requests_in_flight_unless_told_otherwise() -> None:
    """botocore holds 10 connections: a random batch of 64 ranged GETs would wait on the store's latency
    in 7 waves."""

    def pool(options: dict[str, Any]) -> int:
        store = cast(FsspecStore, open_store("s3://bucket/data", storage_options={"anon": True, **options}))
        return int(store.fs.config_kwargs["max_pool_connections"])

    assert pool({}) == MAX_CONNECTIONS >= 64
    assert pool({"config_kwargs": {"max_pool_connections": 8}}) == 8


def test_gcs_and_https_urls_make_fsspec_stores_without_touching_the_network() -> None:
    store = open_store("gs://bucket/datasets/imgs", storage_options={"token": "anon"})
    assert isinstance(store, FsspecStore)
    assert isinstance(store.fs, gcsfs.GCSFileSystem)
    assert store.url("train/shard-0.tar") == "gs://bucket/datasets/imgs/train/shard-0.tar"
    signed = open_store(f"https://host/x/shard.tar?X-Amz-Signature={SECRET}")
    with pytest.raises(UsageError, match="signed URL") as refused:
        signed.url("other.tar")
    assert SECRET not in str(refused.value)
