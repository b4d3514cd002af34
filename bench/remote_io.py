"""``make bench-io ARGS="--remote"``: the same read, with the tar shards in a loopback S3 server.

The server (``bench.remote.loopback_s3``) answers every request after an injected latency and caps each
response's bandwidth. Contenders, side by side in one run:

- ``local-tar-cold`` / ``local-tar-warm``: shardpipe over the local copy, files evicted before each run
  (cold) or read in first (warm): the references;
- ``s3-tar-cold``: shardpipe over ``s3://`` with an empty cache folder each run (every shard downloaded,
  prefetch overlapping download and reading);
- ``s3-tar-warm``: the same with the cache already filled by an untimed epoch;
- ``webdataset-http``: webdataset reading the same tars from the same server through ``pipe:curl``.

Each run also records the bytes the server sent, so "no shard fetched twice per node" is a figure.
``measure`` runs the group, interleaved and rotated, for ``bench.__main__``; its docs section is
``bench-io-remote``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench import contenders, report
from bench.common import system
from bench.contenders import LoaderSettings
from bench.data import Dataset as BenchData
from bench.remote import Endpoint, loopback_s3, upload_dataset
from bench.run import run_once, summarize
from loaders import RemoteOptions, ShardedDataset, make_loader

NAMES = ("local-tar-cold", "local-tar-warm", "s3-tar-cold", "s3-tar-warm", "webdataset-http")
COLD = {"local-tar-cold"}
"""Contenders whose local files are evicted from the page cache before each run."""


def register(endpoint: Endpoint, cache_root: Path, data: BenchData) -> None:
    """Add the remote contenders to ``bench.contenders`` for this endpoint, and fill the warm cache."""
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
            return _loader(dataset, s)

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


def _loader(dataset: ShardedDataset, s: LoaderSettings) -> Iterable[Any]:
    kwargs = s.dataloader_kwargs()
    return make_loader(
        dataset, s.batch_size, s.num_workers, pin_memory=kwargs["pin_memory"],
        persistent_workers=kwargs["persistent_workers"], prefetch_factor=kwargs["prefetch_factor"],
    )  # fmt: skip


def _webdataset(endpoint: Endpoint, data: BenchData, s: LoaderSettings) -> Iterable[Any]:
    """webdataset over the same server: each tar through ``pipe:curl`` of a presigned URL (the server
    answers anonymous requests 403, as a private bucket does)."""
    import boto3

    options = endpoint.storage_options
    client = boto3.client(
        "s3", endpoint_url=options["endpoint_url"], aws_access_key_id=options["key"],
        aws_secret_access_key=options["secret"], region_name=options["client_kwargs"]["region_name"],
    )  # fmt: skip
    bucket, _, prefix = endpoint.root.removeprefix("s3://").partition("/")
    root = data.packed("tar")
    urls = []
    for path in data.shard_files("tar"):
        key = f"{prefix}/{path.relative_to(root).as_posix()}"
        signed = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key})
        urls.append(f"pipe:curl -s -f '{signed}'")
    return contenders.webdataset_loader(urls, s)


def measure(
    args: argparse.Namespace, dataset: BenchData, settings: LoaderSettings, step: Any, warmup: int,
    steps: int, profile_name: str,
) -> list[dict[str, Any]]:  # fmt: skip
    """The ``--remote`` group: interleaved repeats over the loopback S3 server, bytes fetched per run."""
    bandwidth = args.bandwidth_mb * 1e6 if args.bandwidth_mb > 0 else None
    cache_root = args.out / "remote-cache"
    shutil.rmtree(cache_root, ignore_errors=True)
    cache_root.mkdir(parents=True)
    with loopback_s3(latency_s=args.latency_ms / 1000, bandwidth=bandwidth) as endpoint:
        upload_dataset(dataset.packed("tar"), endpoint)
        register(endpoint, cache_root, dataset)
        runs: dict[str, list[Any]] = {n: [] for n in args.contenders}
        fetched: dict[str, list[int]] = {n: [] for n in args.contenders}
        for repeat in range(args.repeats):
            shift = repeat % len(args.contenders)
            for name in args.contenders[shift:] + args.contenders[:shift]:
                endpoint.control.reset_counts()
                run = run_once(name, dataset, settings, step, warmup=warmup, steps=steps,
                               cold=name in COLD)  # fmt: skip
                runs[name].append(run)
                fetched[name].append(endpoint.control.bytes_sent)
                speed = f"{run.samples_per_s:11,.0f} samples/s  fetched {fetched[name][-1] / 1e6:,.1f} MB"
                print(f"  {profile_name:5} remote #{repeat + 1} {name:18} {speed}", flush=True)
    shutil.rmtree(cache_root, ignore_errors=True)
    entries = [summarize(n, runs[n], args.threshold) for n in args.contenders]
    floor = system.floor(dataset.shard_files("tar"), dataset.payload_bytes, cold=False)
    report.add_ratios(entries, floor["payload_mb_per_s"])
    for entry in entries:
        entry.update(profile=profile_name, cache="remote", floor=floor, eviction=None,
                     fetched_mb=[b / 1e6 for b in fetched[entry["contender"]]],
                     latency_ms=args.latency_ms, bandwidth_mb=args.bandwidth_mb)  # fmt: skip
    return entries
