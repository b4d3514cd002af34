"""The command line's side of storage: ``--storage-option KEY=VALUE`` flags, path-or-URL arguments, and
how a location is shown (never with credentials).

Kept apart from ``cli`` so that the commands stay parse-call-convert; nothing here touches a store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from shardpipe.errors import UsageError
from shardpipe.storage import as_location, redact_url, scrub

__all__ = ["location", "parse_storage_options", "scrub", "shown", "storage_option"]


def parse_storage_options(pairs: tuple[str, ...] | dict[str, Any]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as fsspec storage options: a VALUE that reads as JSON (``true``, ``3``,
    ``{"a": 1}``) is that value, else the string; ``a.b=VALUE`` sets key ``b`` of option ``a``."""
    if isinstance(pairs, dict):
        return pairs
    options: dict[str, Any] = {}
    for pair in pairs:
        name, eq, text = pair.partition("=")
        if not eq or not name:
            raise UsageError(f"--storage-option {name or pair!r}: expected KEY=VALUE")
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        *parents, leaf = name.split(".")
        target = options
        for parent in parents:
            target = target.setdefault(parent, {})
            if not isinstance(target, dict):
                raise UsageError(f"--storage-option {name}: {parent} is already set to a value")
        target[leaf] = value
    return options


def location(text: str) -> Path | str:
    """A path argument: a URL stays a string, anything else is a path (``file://`` stripped)."""
    return as_location(text)


def shown(where: Path | str) -> str:
    return redact_url(where) if isinstance(where, str) else str(where)


storage_option = click.option(
    "--storage-option",
    "storage_options",
    metavar="KEY=VALUE",
    multiple=True,
    help="Passed to the fsspec filesystem of a URL (repeatable), e.g. endpoint_url=http://minio:9000, "
    "anon=true, client_kwargs.region_name=eu-west-1. Credentials: prefer the environment or a profile.",
)
