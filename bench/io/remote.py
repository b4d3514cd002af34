"""A loopback S3 server with per-request latency and a bandwidth cap, for ``make bench-io ARGS="--remote"``.

``loopback_s3()`` starts moto's S3 on 127.0.0.1 (the same server the tests use, ``testkit.servers``) in a
process of its own, makes a bucket and yields where it is; ``upload_dataset`` copies a packed dataset
folder into it. The server counts requests and response bytes, so a benchmark can report the bytes fetched
per epoch (with a cache that fits, each shard once per node). ``python -m bench.io.remote --quick`` reads a
synthetic dataset through ``ShardCache`` cold and then warm, as a smoke run of the whole path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import random
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loaders.cache.shard_cache import ShardCache, ShardRef
from shardpipe.storage import open_store
from testkit.servers import CONTROL_PATH, Faults, S3Server

DEFAULT_LATENCY_S = 0.020
#: Per response, bytes per second; None for no cap.
DEFAULT_BANDWIDTH = 200e6


class RemoteControl:
    """The server's counts and fault switch, over HTTP (the server runs in its own process)."""

    def __init__(self, endpoint_url: str):
        self._base = f"{endpoint_url}{CONTROL_PATH}"

    def _call(self, action: str, body: bytes | None = None) -> dict[str, int]:
        request = urllib.request.Request(self._base + action, data=body, method="PUT" if body else "GET")
        with urllib.request.urlopen(request, timeout=30) as answer:
            stats: dict[str, int] = json.loads(answer.read())
        return stats

    @property
    def total(self) -> int:
        """Requests served since the last reset."""
        return self._call("stats")["total"]

    @property
    def bytes_sent(self) -> int:
        """Response bytes sent since the last reset."""
        return self._call("stats")["bytes_sent"]

    def reset_counts(self) -> None:
        self._call("reset")

    def set_faults(self, faults: Faults) -> None:
        self._call("faults", json.dumps(asdict(faults)).encode())


@dataclass(frozen=True, slots=True)
class Endpoint:
    root: str
    """``s3://bucket/prefix`` to pass as the dataset URL."""
    storage_options: Mapping[str, Any]
    control: RemoteControl
    """Request and byte counts; ``control.reset_counts()`` between measured runs."""


def _serve(bucket: str, answer: Any, stop: Any) -> None:
    server = S3Server().start()
    try:
        answer.put((server.make_bucket(bucket), server.endpoint_url, server.storage_options()))
        stop.wait()
    finally:
        server.stop()


@contextmanager
def loopback_s3(
    latency_s: float = DEFAULT_LATENCY_S, bandwidth: float | None = DEFAULT_BANDWIDTH, bucket: str = "bench"
) -> Iterator[Endpoint]:
    """A running S3 server with the given latency and cap, in its own process (it must not share the
    reader's interpreter lock); stopped on exit whatever happens."""
    context = mp.get_context("spawn")
    answer, stop = context.Queue(), context.Event()
    process = context.Process(target=_serve, args=(bucket, answer, stop), daemon=True)
    process.start()
    try:
        root, endpoint_url, options = answer.get(timeout=120)
        control = RemoteControl(endpoint_url)
        control.set_faults(Faults(latency_s=latency_s, bandwidth=bandwidth))
        yield Endpoint(root + "/data", options, control)
    finally:
        stop.set()
        process.join(timeout=30)
        if process.is_alive():
            process.kill()


def upload_dataset(local_dir: Path, endpoint: Endpoint) -> int:
    """Copy every file under ``local_dir`` to the endpoint (verified uploads); return the bytes sent."""
    source = open_store(local_dir)
    target = open_store(endpoint.root, storage_options=endpoint.storage_options)
    total = 0
    for key in source.list_keys():
        target.put_file(key, local_dir / key)
        total += (local_dir / key).stat().st_size
    return total


def _synthetic(endpoint: Endpoint, num_shards: int, shard_bytes: int) -> list[ShardRef]:
    store = open_store(endpoint.root, storage_options=endpoint.storage_options)
    rng = random.Random(0)
    refs = []
    for i in range(num_shards):
        data = rng.randbytes(shard_bytes)
        refs.append(ShardRef(f"shard-{i:05d}.bin", hashlib.sha256(data).hexdigest(), shard_bytes))
        store.put(refs[-1].path, data)
    return refs


def _read_all(cache: ShardCache, refs: list[ShardRef], work_s: float) -> float:
    """Read every shard in order, spending ``work_s`` on each as a consumer would (prefetch overlaps it)."""
    started = time.perf_counter()
    cache.plan(refs)
    for ref in refs:
        with cache.local(ref.path, ref.sha256, ref.num_bytes) as path, open(path, "rb") as f:
            while f.read(1 << 20):
                pass
        time.sleep(work_s)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.io.remote", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="8 shards of 2 MiB")
    p.add_argument("--latency-ms", type=float, default=DEFAULT_LATENCY_S * 1000)
    p.add_argument("--bandwidth-mbs", type=float, default=DEFAULT_BANDWIDTH / 1e6, help="0 = no cap")
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--work-ms", type=float, default=0.0, help="time spent on each shard after reading it")
    args = p.parse_args(argv)
    num_shards, shard_bytes = (8, 2 << 20) if args.quick else (32, 16 << 20)
    bandwidth = args.bandwidth_mbs * 1e6 or None
    with loopback_s3(latency_s=0, bandwidth=None) as endpoint, tempfile.TemporaryDirectory() as tmp:
        refs = _synthetic(endpoint, num_shards, shard_bytes)
        endpoint.control.set_faults(Faults(latency_s=args.latency_ms / 1000, bandwidth=bandwidth))
        for prefetch in sorted({0, args.prefetch}):
            cache_dir = Path(tmp) / f"cache-{prefetch}"
            for state in ("cold", "warm"):
                endpoint.control.reset_counts()
                cache = ShardCache(
                    endpoint.root, cache_dir, prefetch=prefetch, storage_options=endpoint.storage_options
                )
                with cache:
                    seconds = _read_all(cache, refs, args.work_ms / 1000)
                fetched, size_mb = endpoint.control.bytes_sent, num_shards * shard_bytes / 1e6
                print(
                    f"prefetch={prefetch} {state}: {seconds:.2f} s for {size_mb:.0f} MB, "
                    f"{fetched / 1e6:.1f} MB fetched, {endpoint.control.total} requests "
                    f"(latency {args.latency_ms:g} ms, cap {args.bandwidth_mbs:g} MB/s, "
                    f"work {args.work_ms:g} ms/shard)"
                )


if __name__ == "__main__":
    main()
