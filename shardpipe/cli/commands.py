"""The ``shardpipe`` command group: ``pack`` (:mod:`.pack`), ``verify``, ``inspect``, ``index`` and ``get``
(:mod:`.get`). Each parses, calls the library, and leaves its errors to :mod:`.exit_codes` (0 success, 1
a data problem, 2 a usage problem).

Wherever a command takes a path it takes a URL too (``s3://``, ``gs://``, ``http(s)://``); credentials
come the way fsspec and the cloud SDKs take them, and ``--storage-option KEY=VALUE`` passes anything else
to the filesystem. Every message is scrubbed: URLs lose user info and query strings, and the values of
secret-looking options are masked.
"""

from __future__ import annotations

import json
from typing import Any

import click

from shardpipe.cli.exit_codes import errors_to_exit_codes
from shardpipe.cli.get import get
from shardpipe.cli.pack import echo_splits, pack
from shardpipe.cli.storage import location, scrub, shown, storage_option
from shardpipe.tools.index import index as run_index
from shardpipe.tools.inspection import inspect as run_inspect
from shardpipe.tools.inspection import render
from shardpipe.tools.verify import verify as run_verify
from shardpipe.version import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="shardpipe")
def main() -> None:
    """Pack many small sample files into shards (tar, LMDB, TFRecord) with a manifest, and check them.

    \b
    Typical use:
      shardpipe pack images/ data/ --format tar --labels dirname --split train=0.9,val=0.1 --workers 4
      shardpipe verify data/
      shardpipe inspect data/
      shardpipe get data/ cat/0042
    The loaders (`import loaders`) read data/manifest.json in DDP training.
    """


main.add_command(pack)
main.add_command(get)


@main.command()
@click.argument("dataset")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@storage_option
@errors_to_exit_codes
def verify(dataset: str, quiet: bool, storage_options: dict[str, Any]) -> None:
    """Recompute counts, sizes and checksums and parse every record of DATASET (a folder or its manifest,
    a path or a URL; remote shards are fetched one at a time into a temporary folder).

    Exits 1 listing each problem (file and position) if anything disagrees with the manifest.
    """
    where = location(dataset)
    problems = run_verify(where, quiet=quiet, storage_options=storage_options)
    if problems:
        for line in problems:
            click.echo(scrub(line, storage_options), err=True)
        raise click.ClickException(f"{len(problems)} problem(s) found in {shown(where)}")
    click.echo(f"{shown(where)}: OK")


@main.command()
@click.argument("dataset")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@storage_option
@errors_to_exit_codes
def inspect(dataset: str, as_json: bool, storage_options: dict[str, Any]) -> None:
    """Show DATASET's splits, shards, samples, bytes, fields and the spread of shard sizes (DATASET: a
    folder or manifest, a path or a URL such as https://host/data/manifest.json)."""
    summary = run_inspect(location(dataset), storage_options)
    click.echo(json.dumps(summary, indent=1) if as_json else render(summary))


@main.command()
@click.argument("folder")
@click.option(
    "--split",
    "split_name",
    default="train",
    show_default=True,
    help="Split name for shards directly in FOLDER (each subfolder is a split of its own name).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing manifest.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@storage_option
@errors_to_exit_codes
def index(
    folder: str, split_name: str, overwrite: bool, quiet: bool, storage_options: dict[str, Any]
) -> None:
    """Adopt shards written by other tools (webdataset tars, TFRecords of tf.train.Example).

    Scans each shard, writes its offset index beside it and a manifest.json in FOLDER, without
    repacking, so shardpipe's loaders read them like their own. FOLDER may be a URL (s3://bucket/x):
    the indexes and the manifest are uploaded there.
    """
    where = location(folder)
    manifest = run_index(
        where, split_name=split_name, overwrite=overwrite, quiet=quiet, storage_options=storage_options
    )
    echo_splits(manifest, where)
