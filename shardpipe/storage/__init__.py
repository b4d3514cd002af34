"""The storage seam: one interface over a local folder or an object-store prefix.

``open_store(url)`` turns a plain path, ``file://``, ``s3://``, ``gs://`` or ``http(s)://`` URL into a
:class:`Store` rooted there (:mod:`.base` has the protocol). Invariants:

- Local paths take a direct path (``os`` calls, ``pread``); fsspec is not even imported for them.
- No write leaves partial content under a final name (see :class:`Store`).
- Errors are :class:`StorageError` (a ``DataError``) naming the URL with credentials, query string and
  fragment stripped (:mod:`.redact`); no secret reaches a message or a log line.

Inside: :mod:`.base` (the protocol), :mod:`.local` (a local folder, plain ``os`` calls) on :mod:`.files`
(crash-safe placement and content hashes), :mod:`.remote` (object stores through fsspec: retries, error
mapping, verified uploads) with :mod:`.ranges` (neighbouring byte ranges read as one request), and
:mod:`.redact` (no secret in a message or a log line).

Part of the shared core (``shardpipe.manifest``, ``.shardtable``, ``.errors``, ``.formats``, ``.storage``,
``.units``), which the pack stage (``shardpipe.packing``) and the loaders (``loaders``) both stand on: it
imports neither of them, nor the sources, tools or CLI (the import-linter contracts in pyproject.toml, run
by ``make lint``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from shardpipe.errors import UsageError
from shardpipe.storage.base import (
    REMOTE_SCHEMES,
    AccessDeniedError,
    ObjectNotFoundError,
    RetryPolicy,
    StorageError,
    StorageUnavailableError,
    Store,
    as_location,
    is_remote,
    join_key,
    split_url,
)
from shardpipe.storage.local import LocalStore
from shardpipe.storage.redact import redact_url, scrub

__all__ = [
    "AccessDeniedError",
    "LocalStore",
    "ObjectNotFoundError",
    "RetryPolicy",
    "StorageError",
    "StorageUnavailableError",
    "Store",
    "as_location",
    "download",
    "is_remote",
    "join_key",
    "local_copy",
    "open_store",
    "open_writable_store",
    "read_ranges",
    "redact_url",
    "scrub",
    "split_url",
]


def open_store(
    url: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> Store:
    """A store rooted at ``url``; ``storage_options`` go to the fsspec filesystem (ignored locally)."""
    if isinstance(url, str):
        scheme = urlsplit(url).scheme.lower()
        if scheme in REMOTE_SCHEMES:
            from shardpipe.storage.remote import FsspecStore  # fsspec and its clients load only for URLs

            return FsspecStore(url, storage_options or {}, retry or RetryPolicy())
        if scheme == "file":
            return LocalStore(Path(urlsplit(url).path))
        if len(scheme) > 1:  # a one-letter scheme is a Windows drive, a path
            raise UsageError(
                f"unsupported URL scheme {scheme!r} in {redact_url(url)}; use a path or one of "
                f"file, {', '.join(REMOTE_SCHEMES)}"
            )
    return LocalStore(Path(url))


def open_writable_store(
    url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None, action: str
) -> Store:
    """:func:`open_store` for a root to write into; http(s) has no standard upload, so it is refused with
    a message that starts "cannot ``action`` ..."."""
    if isinstance(url, str) and urlsplit(url).scheme.lower() in ("http", "https"):
        raise UsageError(
            f"cannot {action} {redact_url(url)}: http(s) has no standard upload; write to a local folder, "
            "s3:// or gs:// and serve that"
        )
    return open_store(url, storage_options=storage_options)


def download(store: Store, key: str, dest: Path) -> int:
    """Copy one object to the local file ``dest`` (its folder made), chunk by chunk; return its size."""
    size = store.size(key)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as f:
        for chunk in store.iter_chunks(key, size):
            f.write(chunk)
    return size


@contextmanager
def local_copy(store: Store, key: str) -> Iterator[Path]:
    """The object as a local file while the block runs: in place for a local store, else a temporary
    download (deleted after)."""
    local = store.local_path(key)
    if local is not None:
        yield local
        return
    with tempfile.TemporaryDirectory(prefix="shardpipe-copy-") as folder:
        path = Path(folder, os.path.basename(key))
        download(store, key, path)
        yield path


def read_ranges(
    url: str | os.PathLike[str],
    ranges: Sequence[tuple[int, int]],
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> list[bytes]:
    """Bytes of each ``[start, stop)`` range of one object, neighbouring ranges fetched together.

    ``url`` may be a signed URL: it is used whole, query string included (and never printed).
    """
    return open_store(url, storage_options=storage_options).read_ranges("", ranges)
