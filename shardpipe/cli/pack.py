"""``shardpipe pack``: its flags, their parsing into :class:`~shardpipe.packing.PackOptions`, the engine,
and the summary it prints."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal

import click

from shardpipe.cli.exit_codes import errors_to_exit_codes
from shardpipe.cli.storage import location, shown, storage_option
from shardpipe.errors import UsageError
from shardpipe.formats import FORMAT_NAMES
from shardpipe.manifest import MANIFEST_NAME, Manifest
from shardpipe.packing import PackOptions, PackResult
from shardpipe.packing import pack as run_pack
from shardpipe.packing.engine import init_worker
from shardpipe.packing.ray_engine import RayExecutor
from shardpipe.packing.split import parse_split
from shardpipe.process_settings import keep_freed_memory
from shardpipe.units import parse_size


@click.command()
@click.argument("src")
@click.argument("out")
@click.option(
    "--format",
    "format_name",
    type=click.Choice(FORMAT_NAMES),
    required=True,
    help="Shard format: tar (WebDataset convention), lmdb (one file per shard), tfrecord (tf.train.Example).",
)
@click.option(
    "--split",
    "split_spec",
    metavar="NAME=FRAC,...",
    help="Seeded split by key hash, e.g. train=0.9,val=0.1. Default: a Parquet dataset's own splits "
    "(from its files' names), else one split 'train'.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the split hash and of the hashed order."
)
@click.option(
    "--order",
    type=click.Choice(["hashed", "sorted"]),
    default="hashed",
    show_default=True,
    help="Sample order within a split: 'hashed' by a seeded hash of the key (shards mix classes even when "
    "the tree is laid out by class), 'sorted' by key (neighbours stay together).",
)
@click.option("--max-samples", type=click.IntRange(min=1), help="Most samples per shard.")
@click.option(
    "--max-bytes",
    default="256MB",
    show_default=True,
    help="Most payload bytes per shard (e.g. 64MB, 1GiB); 'none' for no limit.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    help="Processes that scan, map and write in parallel. Default: the CPUs this process may use; with "
    "--engine ray: the cluster's CPUs. The output is the same for any count.",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Who scans and writes shards: local processes, or Ray tasks (pip install 'shardpipe[ray]'). "
    "Same output, byte for byte. On a multi-node cluster SRC and OUT must be on a shared mount.",
)
@click.option(
    "--ray-address",
    metavar="HOST:PORT",
    help="Join this Ray cluster (default: RAY_ADDRESS, else a local Ray). Needs --engine ray.",
)
@click.option(
    "--labels",
    type=click.Choice(["dirname"]),
    help="Add a 'cls' field: the index of the sample's first-level folder (ImageFolder style).",
)
@click.option(
    "--literal",
    "literal_fields",
    metavar="FIELD,...",
    default="",
    help="File-list columns whose strings are values, not file paths (e.g. txt captions).",
)
@click.option(
    "--key-column",
    metavar="COLUMN",
    help="A Parquet dataset's column of keys. Default: each row's position in its split, 'train/0000000042'.",
)
@click.option(
    "--field",
    "field_spec",
    metavar="COLUMN=FIELD,...",
    default="",
    help="Name a Parquet dataset's columns as fields, e.g. label=cls,image=jpg; COLUMN= (empty) leaves a "
    "column out. Default: a column keeps its name (a {bytes, path} image or audio column: its files' "
    "extension; a list of numbers: COLUMN.npy).",
)
@click.option("--skip-incomplete", is_flag=True, help="Leave out samples missing a field the others have.")
@click.option(
    "--map",
    "map_spec",
    metavar="MODULE:FUNCTION",
    help="Apply FUNCTION to every sample while packing: it takes a dict {'__key__': ..., 'jpg': b'...', ...} "
    "and returns one, None (drop it) or a list of them (each with its own key). MODULE must be importable "
    "by every worker (installed, or on PYTHONPATH).",
)
@click.option(
    "--map-version",
    metavar="TEXT",
    help="A version for the map, recorded in the manifest; a resume with another version refuses.",
)
@click.option(
    "--on-error",
    type=click.Choice(["raise", "skip"]),
    default="raise",
    show_default=True,
    help="When the map or the image preparation fails on a sample: stop naming it (raise), or leave it "
    "out, counted and named in the manifest (skip).",
)
@click.option(
    "--image-max-side",
    type=click.IntRange(min=1),
    metavar="PIXELS",
    help="Shrink images (jpg, png, webp fields) so their longest side is at most PIXELS (EXIF orientation "
    "applied, Lanczos); smaller images are kept as they are. Needs Pillow (shardpipe[image]).",
)
@click.option(
    "--image-quality",
    type=click.IntRange(1, 100),
    metavar="Q",
    help="JPEG/WebP quality of the shrunk images (default 90). Needs --image-max-side.",
)
@click.option(
    "--compress",
    metavar="zstd[:LEVEL]",
    help="Store fields compressed per sample with zstd (level 1-22, default 3), a dictionary trained per "
    "field for small records; fields of compressed kinds (jpg, png, mp4, gz, ...) are left alone.",
)
@click.option(
    "--compress-fields",
    default="",
    metavar="F1,F2",
    help="The fields --compress compresses (default: every field not of a compressed kind).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted pack of the same job: keep finished shards, redo the rest. On a finished "
    "pack of the same job, do nothing; of another job, refuse saying what differs.",
)
@click.option("--overwrite", is_flag=True, help="Replace a dataset already in OUT (only shardpipe's files).")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@storage_option
@errors_to_exit_codes
def pack(
    src: str,
    out: str,
    format_name: str,
    split_spec: str | None,
    seed: int,
    order: str,
    max_samples: int | None,
    max_bytes: str,
    workers: int | None,
    engine: str,
    ray_address: str | None,
    labels: str | None,
    literal_fields: str,
    key_column: str | None,
    field_spec: str,
    skip_incomplete: bool,
    map_spec: str | None,
    map_version: str | None,
    on_error: Literal["raise", "skip"],
    image_max_side: int | None,
    image_quality: int | None,
    compress: str | None,
    compress_fields: str,
    resume: bool,
    overwrite: bool,
    quiet: bool,
    storage_options: dict[str, Any],
) -> None:
    """Pack SRC (a folder tree, a .csv/.jsonl/.parquet file list, or a Parquet dataset: a .parquet file or a
    folder of them, as Hugging Face's hub serves them) into shards in OUT.

    SRC and OUT may be URLs (s3://bucket/prefix, gs://..., a list's cells too): shards are staged
    locally, uploaded and checked, the manifest uploaded last; --resume works against the bucket.

    \b
    In a tree, files sharing a key form one sample and the extension names the field:
      cat/0001.jpg + cat/0001.json  ->  sample 'cat/0001' with fields jpg, json
    A file list needs a 'key' column and one column per field (a file path, or a value).
    In a Parquet dataset each row is a sample and each column a field (see --key-column, --field).
    OUT gets manifest.json and OUT/<split>/shard-000000.<ext> (+ .idx offset indexes for tar/tfrecord).

    \b
    Preparing while packing (the same shards for any --workers or --engine):
      --image-max-side 512 --image-quality 90     shrink and re-encode images
      --map mymaps:tokenize                       run your own function on every sample
    """
    if ray_address is not None and engine != "ray":
        raise click.UsageError(f"--ray-address {ray_address} needs --engine ray")
    keep_freed_memory()  # this process is a pack: see process_settings
    _find_maps_beside_user(map_spec)
    source, target = location(src), location(out)
    options = PackOptions(
        format=format_name,
        split=None if split_spec is None else parse_split(split_spec),
        seed=seed,
        order=order,
        max_samples=max_samples,
        max_bytes=None if max_bytes.lower() == "none" else parse_size(max_bytes),
        workers=workers,
        labels=labels,
        literal_fields=tuple(f for f in literal_fields.split(",") if f),
        key_column=key_column,
        field_map=parse_field_map(field_spec),
        skip_incomplete=skip_incomplete,
        map=map_spec,
        map_version=map_version,
        on_error=on_error,
        image_max_side=image_max_side,
        image_quality=image_quality,
        compress=compress,
        compress_fields=tuple(f for f in compress_fields.split(",") if f),
        resume=resume,
        overwrite=overwrite,
    )
    result = _run_pack(source, target, options, engine, ray_address, quiet, storage_options)
    _echo_result(result, target)


def _find_maps_beside_user(map_spec: str | None) -> None:
    """Put the working folder on the import path, as `python -m` would: a map module beside the user is
    found."""
    if map_spec is not None and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _run_pack(
    source: Path | str,
    target: Path | str,
    options: PackOptions,
    engine: str,
    ray_address: str | None,
    quiet: bool,
    storage_options: dict[str, Any],
) -> PackResult:
    """Run the pack on local processes, or on Ray tasks with ``engine="ray"``: a Ray executor is ours to
    shut down, however the pack ends."""
    executor = None
    if engine == "ray":
        visible = [p for p in (source, target) if isinstance(p, Path)]  # URLs: every node reaches the store
        executor = RayExecutor(
            ray_address, max_workers=options.workers, visible_paths=visible, initializer=init_worker
        )
    try:
        return run_pack(
            source, target, options, quiet=quiet, executor=executor, storage_options=storage_options
        )
    finally:
        if executor is not None:
            executor.shutdown(wait=False)  # after a failure, tasks still running are cancelled


def _echo_result(result: PackResult, target: Path | str) -> None:
    """Print what the pack did: the splits it holds, then the shards it kept and the inputs it left out
    (only those that happened); a finished pack found again says so alone."""
    if result.already_complete:
        click.echo(f"already complete: {result.num_reused} shards ({manifest_shown(target)})")
        return
    echo_splits(result.manifest, target)
    if result.num_reused:
        click.echo(f"resumed: kept {result.num_reused} finished shard(s), wrote {result.num_written}")
    if result.num_skipped_incomplete:
        click.echo(f"skipped {result.num_skipped_incomplete} incomplete sample(s) (--skip-incomplete)")
    if result.num_ignored_files:
        click.echo(f"ignored {result.num_ignored_files} file(s) without an extension")
    if result.num_skipped_failed:
        click.echo(
            f"skipped {result.num_skipped_failed} sample(s) the map or image preparation failed on "
            "(--on-error skip); the manifest's 'skipped' names them"
        )


def parse_field_map(spec: str) -> dict[str, str]:
    """``"label=cls,meta="`` -> ``{"label": "cls", "meta": ""}`` (an empty name leaves the column out)."""
    found: dict[str, str] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        column, sep, name = part.partition("=")
        if not sep or not column:
            raise UsageError(f"--field {spec!r}: expected COLUMN=FIELD pairs like label=cls,image=jpg")
        if column in found:
            raise UsageError(f"--field {spec!r}: column {column!r} is named twice")
        found[column] = name
    return found


def manifest_shown(root: Path | str) -> str:
    return str(root / MANIFEST_NAME) if isinstance(root, Path) else f"{shown(root)}/{MANIFEST_NAME}"


def echo_splits(manifest: Manifest, root: Path | str) -> None:
    for name, shards in manifest.splits.items():
        click.echo(f"{name}: {sum(s.num_samples for s in shards):,} samples in {len(shards)} shard(s)")
    click.echo(f"manifest: {manifest_shown(root)}")
