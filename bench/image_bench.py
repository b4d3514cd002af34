"""The image side of ``python -m bench``: ``--profile images``, and ``--data PACK --field jpg``.

``--profile images`` measures the profiles ``images`` (ImageNet-size photos) and ``images-large``
(camera-size photos), every contender of ``bench.image_contenders`` and the decode limit side by side,
interleaved and rotated as ``bench.__main__`` does for bytes, and judges the image targets
(``bench.targets``). ``--data`` runs the same measurement on a pack of the user's: the per-sample Pillow
path against the fused crops, the decode limit, and what preparing the images at pack time
(``--image-max-side 256``) would give, that last one measured on the same photos shrunk in memory
(``ImagePreparation(256)``, what the pack option runs) as ``decode-limit-256``; then prints its verdict.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import image_report
from bench import targets as targets_module
from bench.common import system
from bench.compute import BusyStep, make_image_step
from bench.contenders import SEED, SHUFFLE_BUFFER, LoaderSettings
from bench.image_contenders import LIMIT, LIMIT_256, ImageSource, is_limit
from bench.image_data import IMAGE_PROFILES, PREPARED_MAX_SIDE, QUICK_IMAGE_PROFILES, prepare_images
from bench.image_limit import columns_of
from bench.image_run import run_image_once, summarize_image
from loaders import RaggedBytes, ShardedDataset

WINDOWS = {"images": (5, 80), "images-large": (2, 24)}  # (warmup, steps): about 5,000 and 1,500 photos
QUICK_WINDOWS = {"images": (1, 3), "images-large": (1, 2)}
DATA_WINDOW, QUICK_DATA_WINDOW = (3, 40), (1, 3)
DATA_MAX_PHOTOS = 512  # photos of a --data pack held in memory for the decode limits
DATA_MAX_BYTES = 512 << 20

Columns = list[tuple[RaggedBytes, list[str]]]


def run_profiles(
    args: argparse.Namespace,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """Both image profiles: (meta, results, targets)."""
    started = time.perf_counter()
    profiles = QUICK_IMAGE_PROFILES if args.quick else IMAGE_PROFILES
    windows = QUICK_WINDOWS if args.quick else WINDOWS
    settings = LoaderSettings(args.batch_size, args.workers)
    results: list[dict[str, Any]] = []
    datasets: dict[str, Any] = {}
    for name, profile in profiles.items():
        data = prepare_images(profile, args.cache, workers=max(args.workers, 1))
        files = data.files()
        source = ImageSource(pack=data.packed("tar"), tree=data.tree,
                             prepared=data.packed(f"tar-{PREPARED_MAX_SIDE}"),
                             shards=tuple(data.shard_files("tar")))  # fmt: skip
        warmup, steps = _window(args, windows[name])
        step = make_image_step(args.compute_ms)
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
        entries = measure(name, args.contenders, source, columns, settings, step, warmup, steps, args)
        results.extend(entries)
    found = targets_module.image_targets(results)
    return _meta(args, started, datasets, settings), results, found


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
    warmup, steps = _window(args, QUICK_DATA_WINDOW if args.quick else DATA_WINDOW)
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
    meta["verdicts"] = verdicts(results, datasets["data"], args)
    return meta, results


def measure(profile: str, names: list[str], source: ImageSource, columns: dict[str, Columns],
            settings: LoaderSettings, step: Any, warmup: int, steps: int,
            args: argparse.Namespace) -> list[dict[str, Any]]:  # fmt: skip
    """Every contender ``--repeats`` times, interleaved and rotated; summaries with paired ratios."""
    runs: dict[str, list[Any]] = {n: [] for n in names}
    for repeat in range(args.repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            system.read_all(_files_read(name, source))  # warm means warm, as in bench.run
            run = run_image_once(name, source, settings, step, warmup=warmup, steps=steps,
                                 limit_columns=columns.get(name))  # fmt: skip
            runs[name].append(run)
            wait = (
                ""
                if is_limit(name)
                else f"  wait {run.wait_fraction:4.0%}  first batch {run.first_batch_s:.2f} s"
            )
            print(f"  {profile:12} #{repeat + 1} {name:19} {run.samples_per_s:9,.0f} samples/s  "
                  f"{1000 * run.cpu_s / run.samples:6.2f} CPU ms/image{wait}", flush=True)  # fmt: skip
    entries = [summarize_image(n, runs[n], args.threshold) for n in names]
    image_report.add_paired(entries)
    for entry in entries:
        entry["profile"] = profile
    return entries


def verdicts(results: list[dict[str, Any]], data: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """What a ``--data`` run says: is the input the bottleneck, and what the fused path and pack-time
    resizing would give."""
    by = {e["contender"]: e for e in results}
    batch = args.batch_size
    lines = [
        f"your data: {data['path']}, field {data['field']}: {data['num_samples']:,} samples, median "
        f"{data['size']} px, {data['mean_sample_bytes'] / 1e3:,.0f} kB each (of the "
        f"{data['photos_in_memory']} read for the decode limits)"
    ]
    for name, what in (
        ("shardpipe-pil", "per-sample Pillow (a transform)"),
        ("shardpipe-fused", "fused crops"),
    ):
        if name in by:
            e = by[name]
            lines.append(
                f"{what} ({name}): {e['samples_per_s']:,.0f} samples/s, "
                f"{e['cpu_ms_per_sample']:.2f} CPU ms/image; "
                f"a batch of {batch} every {1000 * batch / e['samples_per_s']:,.0f} ms with {args.workers} "
                f"workers: a training step shorter than that waits for input (wait {e['wait_fraction']:.0%} "
                f"of the step at --compute-ms {args.compute_ms:g}: {e['verdict']})"
            )
    if {"shardpipe-fused", "shardpipe-pil"} <= by.keys():
        ratio = by["shardpipe-fused"]["paired"].get("shardpipe-pil")
        if ratio is None:
            ratio = by["shardpipe-fused"]["samples_per_s"] / by["shardpipe-pil"]["samples_per_s"]
        lines.append(f"the fused path gives {ratio:.2f}x the per-sample Pillow path's samples/s")
    if {"shardpipe-fused", LIMIT} <= by.keys():
        lines.append(
            f"decode limit ({args.workers} processes, the crop alone): {by[LIMIT]['samples_per_s']:,.0f} "
            f"samples/s; the fused loader reaches {by['shardpipe-fused']['paired'][LIMIT]:.2f}x of it"
        )
    if {LIMIT, LIMIT_256} <= by.keys():
        gain = by[LIMIT_256]["paired"][LIMIT]
        shrunk = data["prepared_mean_sample_bytes"] / data["mean_sample_bytes"]
        lines.append(
            f"prepared at pack time (shardpipe pack --image-max-side {PREPARED_MAX_SIDE}): decode limit "
            f"{by[LIMIT_256]['samples_per_s']:,.0f} samples/s, {gain:.2f}x today's, images {shrunk:.0%} of "
            "their size (measured on the same photos shrunk in memory)"
        )
    return lines


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
    root = source.prepared if name == "shardpipe-fused-256" and source.prepared else source.pack
    return [p for p in sorted(root.rglob("*")) if p.is_file()]


def _window(args: argparse.Namespace, default: tuple[int, int]) -> tuple[int, int]:
    warmup = default[0] if args.warmup is None else args.warmup
    return warmup, default[1] if args.steps is None else args.steps


def _meta(args: argparse.Namespace, started: float, datasets: dict[str, Any],
          settings: LoaderSettings) -> dict[str, Any]:  # fmt: skip
    import torch

    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": round(time.perf_counter() - started, 1),
        "hardware": system.hardware(),
        "versions": {**system.versions(), "pillow": _pillow_version()},
        "datasets": datasets,
        "parameters": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "settings": {**asdict(settings), "shuffle_buffer": SHUFFLE_BUFFER, "seed": SEED},
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "rules": image_report.RULES,
    }


def _pillow_version() -> str:
    import PIL

    return str(PIL.__version__)
