"""``shardpipe get``: one sample of a packed dataset, by position or key, listed or written out as files.

It reads through the loaders' random access (``loaders.random_access``): the sample's own bytes, checked
against its checksum, locally or by one ranged request; the only command that imports the loaders (and
torch), so it does so when it runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from shardpipe.cli.exit_codes import errors_to_exit_codes
from shardpipe.cli.storage import location, shown, storage_option
from shardpipe.errors import UsageError


@click.command(context_settings={"ignore_unknown_options": True})  # SAMPLE may be -1
@click.argument("dataset")
@click.argument("sample")
@click.option("--split", default="train", show_default=True, help="The split to read.")
@click.option("--key", "by_key", is_flag=True, help="SAMPLE is a key even though it is all digits.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write each field to OUT/<key>.<field> (folders made as the key needs); else list the fields.",
)
@storage_option
@errors_to_exit_codes
def get(
    dataset: str, sample: str, split: str, by_key: bool, out: Path | None, storage_options: dict[str, Any]
) -> None:
    """Show or extract one sample of DATASET (a folder, manifest or URL). SAMPLE is its position in the
    split (0-based; negative counts from the end) when it is all digits, else its key (e.g. cat/0042).

    \b
    Examples:
      shardpipe get data/ cat/0042               # its fields, sizes and short values
      shardpipe get data/ -1                     # the split's last sample
      shardpipe get data/ 17 --split val --out x/  # x/<key>.jpg, x/<key>.cls, ...

    A position counts samples in the pack's order, which is a hashed order by default: it is not the
    source's row. Packed with `--order sorted`, a Hugging Face or Parquet row keeps its place (row 42 of
    split train is key train/0000000042 at position 42). A key lookup first reads every key of the
    split once; a position needs only the sample's bytes. Exits 2 when the split has no such position
    or key.
    """
    from loaders.random_access import get as get_sample

    where = location(dataset)
    wanted = int(sample) if re.fullmatch(r"-?\d+", sample) and not by_key else sample
    found = get_sample(where, wanted, split=split, storage_options=storage_options)
    key, position = found.pop("__key__"), found.pop("__position__")
    found.pop("__pad__")
    if out is None:
        click.echo(f"{key}  (sample {position} of split {split!r} in {shown(where)})")
        for name, value in found.items():
            click.echo(f"  {name:<16} {len(value):>12,} bytes{_preview(value)}")
        return
    for name, value in found.items():
        target = out / f"{key}.{name}"
        if not target.resolve().is_relative_to(out.resolve()):
            raise UsageError(f"key {key!r} would write outside {out}; extract this sample another way")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(value)
        click.echo(str(target))


def _preview(value: bytes, limit: int = 80) -> str:
    """A short value shown as its text (a class, a caption), else nothing."""
    if len(value) > limit:
        return ""
    try:
        text = value.decode()
    except UnicodeDecodeError:
        return ""
    return f"  {text!r}" if text.isprintable() else ""
