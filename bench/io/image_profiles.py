"""The image profiles of ``python -m bench.io``: ``--profile images``, and ``--data PACK --field jpg``.

``--profile images`` measures the profiles ``images`` (ImageNet-size photos) and ``images-large``
(camera-size photos), every contender of ``bench.io.image_contenders`` and the decode limit side by side,
in the rounds of ``bench.io.run``, and judges the image targets (``bench.io.targets``). ``--data`` runs
the same measurement on a pack of the user's: the per-sample Pillow path against the fused crops, the
decode limit, and what preparing the images at pack time (``--image-max-side PREPARED_MAX_SIDE``) would
give, that last one measured on the same photos shrunk in memory (``ImagePreparation``, what the pack
option runs) as ``LIMIT_256``; then its verdict (``bench.io.image_report.verdicts``).
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import system
from bench.common.system import PeakRss
from bench.io import image_report, report, targets
from bench.io.compute import BusyStep, Step, make_image_step
from bench.io.contenders import LoaderSettings
from bench.io.decode_limit import columns_of, decode_limit
from bench.io.image_contenders import (
    FINISH_SECONDS,
    FUSED_PREPARED,
    LIMIT,
    LIMIT_256,
    ImageSource,
    build_image,
    is_limit,
)
from bench.io.image_data import (
    IMAGE_PROFILES,
    IMAGE_WINDOWS,
    PREPARED_MAX_SIDE,
    QUICK_IMAGE_PROFILES,
    QUICK_IMAGE_WINDOWS,
    prepare_images,
)
from bench.io.run import Run, rounds, summarize, timed, window
from loaders import ShardedDataset
from loaders.batches import RaggedBytes

DATA_WINDOW, QUICK_DATA_WINDOW = (3, 40), (1, 3)
DATA_MAX_PHOTOS = 512  # photos of a --data pack held in memory for the decode limits
DATA_MAX_BYTES = 512 << 20

Columns = list[tuple[RaggedBytes, list[str]]]


def run_profiles(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Both image profiles: (meta, results), the targets in ``meta["targets"]``."""
    started = time.perf_counter()
    profiles = QUICK_IMAGE_PROFILES if args.quick else IMAGE_PROFILES
    windows = QUICK_IMAGE_WINDOWS if args.quick else IMAGE_WINDOWS
    settings = LoaderSettings(args.batch_size, args.workers)
    results: list[dict[str, Any]] = []
    datasets: dict[str, Any] = {}
    for name, profile in profiles.items():
        data = prepare_images(profile, args.cache, workers=max(args.workers, 1))
        files = data.files()
        source = ImageSource(
            pack=data.packed("tar"),
            tree=data.tree,
            prepared=data.packed(f"tar-{PREPARED_MAX_SIDE}"),
            shards=tuple(data.shard_files("tar")),
            device=args.device,
        )
        warmup, steps = window(windows[name], args.warmup, args.steps)
        step = make_image_step(args.compute_ms, resnet50=args.device == "cuda")
        datasets[name] = {
            "profile": name,
            "fingerprint": profile.fingerprint,
            "num_samples": profile.num_photos,
            "size": "x".join(map(str, profile.size)),
            "mean_sample_bytes": data.payload_bytes / profile.num_photos,
            "prepared_mean_sample_bytes": _pack_bytes(data.shard_files(f"tar-{PREPARED_MAX_SIDE}"))
            / profile.num_photos,
            "warmup_steps": warmup,
            "measured_steps": steps,
            "compute_iterations": step.iterations if isinstance(step, BusyStep) else None,
        }
        keys = [str(f.relative_to(data.tree).with_suffix("")) for f in files]
        columns = {LIMIT: columns_of([f.read_bytes() for f in files], keys, args.batch_size)}
        results.extend(measure(name, args.contenders, source, columns, settings, step, warmup, steps, args))
    meta = _meta(args, started, datasets, settings)
    meta["targets"] = targets.image_targets(results)
    return meta, results


def run_data(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A pack of the user's: (meta, results), the verdict lines in ``meta["verdicts"]``."""
    started = time.perf_counter()
    pack = Path(args.data)
    settings = LoaderSettings(args.batch_size, args.workers)
    fields = ShardedDataset(pack, shuffle=False).manifest.fields
    source = ImageSource(pack=pack, field=args.field, label="cls" if "cls" in fields else None)
    jpegs, keys = read_photos(pack, args.field, 64 if args.quick else DATA_MAX_PHOTOS)
    prepared = _prepare_all(jpegs, max(args.workers, 1))
    columns = {
        LIMIT: columns_of(jpegs, keys, args.batch_size),
        LIMIT_256: columns_of(prepared, keys, args.batch_size),
    }
    warmup, steps = window(QUICK_DATA_WINDOW if args.quick else DATA_WINDOW, args.warmup, args.steps)
    step = make_image_step(args.compute_ms, args.field, source.label or "cls")
    sizes = [_size(data) for data in jpegs]
    datasets = {
        "data": {
            "profile": "data",
            "path": str(pack),
            "field": args.field,
            "num_samples": len(ShardedDataset(pack, shuffle=False)),
            "size": "x".join(str(round(statistics.median(s[i] for s in sizes))) for i in (0, 1)),
            "mean_sample_bytes": sum(map(len, jpegs)) / len(jpegs),
            "prepared_mean_sample_bytes": sum(map(len, prepared)) / len(prepared),
            "photos_in_memory": len(jpegs),
            "warmup_steps": warmup,
            "measured_steps": steps,
        }
    }
    results = measure("data", args.contenders, source, columns, settings, step, warmup, steps, args)
    meta = _meta(args, started, datasets, settings)
    meta.update(
        targets=[], verdicts=image_report.verdicts(results, datasets["data"], args)
    )  # no targets: your data
    return meta, results


def measure(
    profile: str,
    names: list[str],
    source: ImageSource,
    columns: dict[str, Columns],
    settings: LoaderSettings,
    step: Step,
    warmup: int,
    steps: int,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """Every contender ``--repeats`` times, in rounds; summaries with paired ratios."""

    finish_ms: dict[str, list[float]] = {}

    def one(name: str) -> Run:
        system.read_all(_files_read(name, source))  # warm means warm, as in bench.io.run
        if is_limit(name):
            return _limit_run(name, columns.get(name), settings, steps)
        FINISH_SECONDS.clear()
        run = timed(
            lambda: build_image(name, source, settings),
            step,
            warmup=warmup,
            steps=steps,
            count=lambda batch: len(batch[source.field]),
            cycle=True,
        )
        if FINISH_SECONDS:  # the trainer-side decode of shardpipe-fused-device, window and warm-up alike
            finish_ms.setdefault(name, []).append(1000 * statistics.median(FINISH_SECONDS))
        return run

    def show(repeat: int, name: str, run: Run) -> None:
        wait = (
            ""
            if is_limit(name)
            else f"  wait {run.wait_fraction:4.0%}  first batch {run.first_batch_s:.2f} s"
        )
        if name in finish_ms and len(finish_ms[name]) > repeat:
            wait += f"  trainer decode {finish_ms[name][repeat]:.1f} ms/batch"
        print(
            f"  {profile:12} #{repeat + 1} {name:19} {run.samples_per_s:9,.0f} samples/s  "
            f"{1000 * (run.cpu_s or 0.0) / run.samples:6.2f} CPU ms/image{wait}",
            flush=True,
        )

    runs = rounds(names, args.repeats, one, show)
    entries = [summarize(n, runs[n], args.threshold, judged=not is_limit(n)) for n in names]
    image_report.add_paired(entries)
    for entry in entries:
        entry["profile"] = profile
        if entry["contender"] in finish_ms:  # median over runs of each run's median batch
            entry["trainer_decode_ms_per_batch"] = statistics.median(finish_ms[entry["contender"]])
    return entries


def _limit_run(name: str, columns: Columns | None, settings: LoaderSettings, steps: int) -> Run:
    """The decode limit over as many samples as a loader's window: no wait, no first batch, the CPU of
    its own processes."""
    if columns is None:
        raise ValueError(f"{name} needs the photos as columns")
    with PeakRss() as rss:
        limit = decode_limit(columns, settings.num_workers, steps * settings.batch_size)
    return Run(
        samples=limit.samples,
        seconds=limit.samples / limit.samples_per_s,
        wait_s=0.0,
        copy_s=0.0,
        compute_s=0.0,
        steps=-(-limit.samples // settings.batch_size),
        first_batch_s=0.0,
        peak_rss=rss.peak,
        cpu_s=limit.cpu_s,
    )


def read_photos(pack: Path, field: str, limit: int) -> tuple[list[bytes], list[str]]:
    """The first ``limit`` images of the pack (at most ``DATA_MAX_BYTES``), and their keys."""
    jpegs: list[bytes] = []
    keys: list[str] = []
    with ShardedDataset(pack, shuffle=False) as dataset:
        for sample in dataset:
            jpegs.append(sample[field])
            keys.append(sample["__key__"])
            if len(jpegs) >= limit or sum(map(len, jpegs)) >= DATA_MAX_BYTES:
                break
    return jpegs, keys


def _prepare_all(jpegs: list[bytes], workers: int) -> list[bytes]:
    from shardpipe.packing.images import ImagePreparation

    prepare = ImagePreparation(PREPARED_MAX_SIDE).prepare
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return pool.map(prepare, jpegs, chunksize=16)


def _size(data: bytes) -> tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
    return width, height


def _pack_bytes(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


def _files_read(name: str, source: ImageSource) -> list[Path]:
    """What a contender reads from disk (nothing for the decode limits: their photos are in memory)."""
    if is_limit(name):
        return []
    if name == "imagefolder-pil" and source.tree is not None:
        return sorted(source.tree.rglob("*.jpg"))
    root = source.prepared if name == FUSED_PREPARED and source.prepared else source.pack
    return [p for p in sorted(root.rglob("*")) if p.is_file()]


def _meta(
    args: argparse.Namespace, started: float, datasets: dict[str, Any], settings: LoaderSettings
) -> dict[str, Any]:
    import PIL

    return report.meta(args, started, datasets, settings, image_report.RULES, pillow=str(PIL.__version__))
