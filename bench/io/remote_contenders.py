"""``make bench-io ARGS="--remote"``: the same read, with the tar shards in a loopback S3 server.

The server (``bench.io.remote.loopback_s3``) answers every request after an injected latency and caps each
response's bandwidth. Contenders, side by side in one run:

- ``local-tar-cold`` / ``local-tar-warm``: shardpipe over the local copy, files evicted before each run
  (cold) or read in first (warm): the references;
- ``s3-tar-cold``: shardpipe over ``s3://`` with an empty cache folder each run (every shard downloaded,
  prefetch overlapping download and reading);
- ``s3-tar-warm``: the same with the cache already filled by an untimed epoch;
- ``webdataset-http``: webdataset reading the same tars from the same server through ``pipe:curl``.

Each run also records the bytes the server sent, so "no shard fetched twice per node" is a figure.
``measure`` runs the group in rounds for ``bench.io.byte_profiles``; its docs section is
``bench-io-remote``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench.common import system
from bench.io import byte_report, contenders
from bench.io.compute import Step
from bench.io.contenders import LoaderSettings
from bench.io.data import Dataset as BenchData
from bench.io.remote import Endpoint, loopback_s3, upload_dataset
from bench.io.run import Run, rounds, run_once
from loaders import RemoteOptions, ShardedDataset

NAMES = ("local-tar-cold", "local-tar-warm", "s3-tar-cold", "s3-tar-warm", "webdataset-http")
COLD = {"local-tar-cold"}
"""Contenders whose local files are evicted from the page cache before each run."""


def register(endpoint: Endpoint, cache_root: Path, data: BenchData) -> None:
    """Add the remote contenders to ``bench.io.contenders`` for this endpoint, and fill the warm cache."""
    warm = cache_root / "warm"
    shutil.rmtree(warm, ignore_errors=True)

    def s3(cache_dir: Callable[[], Path]) -> Callable[[BenchData, LoaderSettings], Iterable[Any]]:
        def build(_: BenchData, s: LoaderSettings) -> Iterable[Any]:
            dataset = ShardedDataset(
                endpoint.root,
                shuffle=True,
                seed=contenders.SEED,
                shuffle_buffer=contenders.SHUFFLE_BUFFER,
                remote=RemoteOptions(storage_options=endpoint.storage_options, cache_dir=cache_dir()),
            )
            return contenders.shardpipe_loader(dataset, s)

        return build

    def fresh() -> Path:
        return Path(tempfile.mkdtemp(prefix="cold-", dir=cache_root))

    local = contenders.BUILDERS["shardpipe-tar"]
    contenders.BUILDERS.update(
        {
            "local-tar-cold": local,
            "local-tar-warm": local,
            "s3-tar-cold": s3(fresh),
            "s3-tar-warm": s3(lambda: warm),
            "webdataset-http": lambda d, s: _webdataset(endpoint, d, s),
        }
    )
    for _ in contenders.BUILDERS["s3-tar-warm"](data, LoaderSettings(64, 0)):  # fills the warm cache
        pass


def _webdataset(endpoint: Endpoint, data: BenchData, s: LoaderSettings) -> Iterable[Any]:
    """webdataset over the same server: each tar through ``pipe:curl`` of a presigned URL (the server
    answers anonymous requests 403, as a private bucket does)."""
    import boto3

    options = endpoint.storage_options
    client = boto3.client(
        "s3",
        endpoint_url=options["endpoint_url"],
        aws_access_key_id=options["key"],
        aws_secret_access_key=options["secret"],
        region_name=options["client_kwargs"]["region_name"],
    )
    bucket, _, prefix = endpoint.root.removeprefix("s3://").partition("/")
    root = data.packed("tar")
    urls = []
    for path in data.shard_files("tar"):
        key = f"{prefix}/{path.relative_to(root).as_posix()}"
        signed = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key})
        urls.append(f"pipe:curl -s -f '{signed}'")
    return contenders.webdataset_loader(urls, s)


def measure(
    args: argparse.Namespace,
    dataset: BenchData,
    settings: LoaderSettings,
    step: Step,
    warmup: int,
    steps: int,
    profile_name: str,
) -> list[dict[str, Any]]:
    """The ``--remote`` group: rounds over the loopback S3 server, the bytes fetched by each run."""
    bandwidth = args.bandwidth_mb * 1e6 if args.bandwidth_mb > 0 else None
    cache_root = args.out / "remote-cache"
    shutil.rmtree(cache_root, ignore_errors=True)
    cache_root.mkdir(parents=True)
    fetched: dict[str, list[int]] = {n: [] for n in args.contenders}
    with loopback_s3(latency_s=args.latency_ms / 1000, bandwidth=bandwidth) as endpoint:
        upload_dataset(dataset.packed("tar"), endpoint)
        register(endpoint, cache_root, dataset)

        def one(name: str) -> Run:
            endpoint.control.reset_counts()
            run = run_once(name, dataset, settings, step, warmup=warmup, steps=steps, cold=name in COLD)
            fetched[name].append(endpoint.control.bytes_sent)
            return run

        def show(repeat: int, name: str, run: Run) -> None:
            speed = f"{run.samples_per_s:11,.0f} samples/s  fetched {fetched[name][-1] / 1e6:,.1f} MB"
            print(f"  {profile_name:5} remote #{repeat + 1} {name:18} {speed}", flush=True)

        runs = rounds(args.contenders, args.repeats, one, show)
    shutil.rmtree(cache_root, ignore_errors=True)
    floor = system.floor(dataset.shard_files("tar"), dataset.payload_bytes, cold=False)
    entries = byte_report.byte_entries(
        runs,
        args.threshold,
        floor,
        profile=profile_name,
        cache="remote",
        eviction=None,
        latency_ms=args.latency_ms,
        bandwidth_mb=args.bandwidth_mb,
    )
    for entry in entries:
        entry["fetched_mb"] = [b / 1e6 for b in fetched[entry["contender"]]]
    return entries
