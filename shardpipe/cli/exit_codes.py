"""Exit codes of the ``shardpipe`` command: 0 success, 1 a data problem (named file and position), 2 a
usage problem. The library's errors speak of options by their meaning; :func:`with_flags` adds the flags
that fix them. Every message is scrubbed: URLs lose user info and query strings, and the values of
secret-looking options are masked."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from shardpipe.cli.storage import parse_storage_options, scrub
from shardpipe.errors import DataError, UsageError
from shardpipe.packing.options import ConflictingOptionsError
from shardpipe.packing.output import JobMismatchError, OutputNotEmptyError
from shardpipe.packing.plan import SampleTooLargeError
from shardpipe.packing.shard_writing import SourceFileError
from shardpipe.sources import IncompleteSamplesError
from shardpipe.sources.parquet_columns import UnusableColumnError

F = TypeVar("F", bound=Callable[..., Any])


def errors_to_exit_codes(func: F) -> F:
    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            options = parse_storage_options(kwargs.get("storage_options", ()))
        except UsageError as exc:
            raise click.UsageError(str(exc)) from exc
        if "storage_options" in kwargs:
            kwargs["storage_options"] = options
        try:
            return func(*args, **kwargs)
        except UsageError as exc:
            raise click.UsageError(scrub(with_flags(exc), options)) from None
        except DataError as exc:
            raise click.ClickException(scrub(with_flags(exc), options)) from None

    return wrapper  # type: ignore[return-value]


def with_flags(exc: Exception) -> str:
    """The library's message, plus the command-line flags that resolve it where there are some."""
    hint = ""
    if isinstance(exc, ConflictingOptionsError):
        return f"{' and '.join(f'--{name}' for name in exc.names)} contradict each other; choose one"
    if isinstance(exc, UnusableColumnError):
        return f"{exc.problem}; pass --field {exc.column}= to leave it out"
    if isinstance(exc, OutputNotEmptyError):
        hint = "use --overwrite to replace it"
        if exc.holds_dataset:
            hint += ", or --resume to finish (or confirm) the same pack"
    elif isinstance(exc, JobMismatchError):
        hint = "rerun with the original options and source, or use --overwrite to replace it"
    elif isinstance(exc, SampleTooLargeError):
        hint = "raise --max-bytes"
    elif isinstance(exc, IncompleteSamplesError):
        hint = "fix the source or pass --skip-incomplete to leave them out"
    elif isinstance(exc, SourceFileError):
        hint = (
            "rerun the pack with --overwrite"
            if exc.changed
            else "fix the file and rerun with --resume, or remove it and rerun with --overwrite"
        )
    return f"{exc}; {hint}" if hint else str(exc)
