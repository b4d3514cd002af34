"""The storage seam's vocabulary: the ``Store`` protocol, its errors, its retry policy, and URL helpers.

A store is rooted at a local folder or an object-store prefix; callers address objects by keys relative to
that root with ``/`` separators (the manifest's own paths). Everything above the seam reads and writes
bytes and never knows where they live. Backends: :mod:`.local` (plain ``os`` calls) and :mod:`.remote`
(fsspec); :func:`shardpipe.storage.open_store` picks one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import urlsplit, urlunsplit

from shardpipe.errors import DataError, UsageError

REMOTE_SCHEMES = ("s3", "gs", "gcs", "http", "https")


class StorageError(DataError):
    """A storage operation failed; ``url`` is the redacted address it concerned."""

    def __init__(self, message: str, url: str = "") -> None:
        super().__init__(message)
        self.url = url


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """No object at the URL (HTTP 404); also a ``FileNotFoundError`` so path-style callers keep working."""


class AccessDeniedError(StorageError, PermissionError):
    """The store refused the request (HTTP 403)."""


class StorageUnavailableError(StorageError):
    """Transient failures (resets, timeouts, 5xx, throttling) outlasted the retry limit."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard to try before a transient failure becomes an error."""

    max_attempts: int = 6
    """Attempts per request, the first included."""
    backoff_s: float = 0.1
    """First wait; it doubles (with jitter) up to ``max_backoff_s``."""
    max_backoff_s: float = 5.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    operation_timeout_s: float = 900.0
    """No single call (one upload included) may take longer; raise it for very large shards."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise UsageError(f"max_attempts must be >= 1, got {self.max_attempts}")
        for name in (
            "backoff_s",
            "max_backoff_s",
            "connect_timeout_s",
            "read_timeout_s",
            "operation_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise UsageError(f"{name} must be > 0, got {getattr(self, name)}")


class Store(Protocol):
    """Operations shardpipe needs on a dataset root; ``key`` is relative to it, ``/``-separated.

    ``put``, ``put_file`` and ``publish`` never leave partial content under a final name: locally a
    temporary name is flushed and renamed; an object store shows an object whole or not at all, and the
    upload is read back and checked against its sha256 before the call returns.
    """

    @property
    def root(self) -> str:
        """The root as given (may carry credentials: never print it; use ``display``)."""
        ...

    @property
    def display(self) -> str:
        """The root, safe to print."""
        ...

    def local_path(self, key: str = "") -> Path | None:
        """The local file behind ``key``, or None for a remote store (callers then copy or cache it)."""
        ...

    def url(self, key: str = "") -> str: ...
    def exists(self, key: str) -> bool: ...
    def size(self, key: str) -> int: ...
    def list_keys(self, prefix: str = "") -> list[str]: ...
    def list_sizes(self, prefix: str = "") -> dict[str, int]:
        """Every key under ``prefix`` with its size, from the listing where the store gives sizes."""
        ...

    def open(self, key: str) -> BinaryIO: ...
    def read(self, key: str) -> bytes: ...
    def read_range(self, key: str, start: int, stop: int) -> bytes: ...
    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]: ...
    def iter_chunks(self, key: str, size: int, chunk_size: int = ...) -> Iterator[bytes]: ...
    def sha256(self, key: str) -> tuple[str, int]: ...
    def put(self, key: str, data: bytes, *, sha256: str | None = None) -> str:
        """Write ``data`` as ``key`` whole (checked against ``sha256`` if given); return its sha256."""
        ...

    def put_file(self, key: str, source: Path, *, sha256: str | None = None) -> str: ...
    def append(self, key: str, data: bytes) -> None:
        """Add ``data`` at the end of ``key`` (made if missing) and flush: for small logs such as a pack's
        journal. An object store has no append: the object is read and written again whole."""
        ...

    def staging(self, key: str) -> AbstractContextManager[Path]:
        """A local file to write ``key``'s content into, for :meth:`publish`; removed if never published."""
        ...

    def publish(self, key: str, staged: Path, sha256: str) -> None:
        """Make the file written at ``staging(key)`` (whose content hashes to ``sha256``) the object."""
        ...

    def move(self, source: str, key: str) -> None:
        """Give the object ``source`` the name ``key`` (locally a rename; an object store copies within
        itself and removes the source: never a partial object under either name)."""
        ...

    def remove(self, key: str, *, missing_ok: bool = True) -> None: ...
    def remove_temporaries(self) -> int:
        """Delete what interrupted writes left under the root (local temporaries; an object store has
        none); return how many."""
        ...


def is_remote(url: str | os.PathLike[str]) -> bool:
    return isinstance(url, str) and urlsplit(url).scheme.lower() in REMOTE_SCHEMES


def as_location(where: str | os.PathLike[str]) -> Path | str:
    """A path argument as shardpipe handles it: a remote URL stays a string, a ``file://`` URL or a plain
    path becomes a ``Path``."""
    if is_remote(where):
        return str(where)
    text = os.fspath(where)
    return Path(urlsplit(text).path) if text.startswith("file://") else Path(text)


def split_url(url: str | os.PathLike[str]) -> tuple[str, str]:
    """``(parent, name)`` of a file URL or path, so ``open_store(parent).read(name)`` reads it."""
    text = os.fspath(url)
    if not is_remote(text):
        path = Path(text.removeprefix("file://") if text.startswith("file://") else text)
        return str(path.parent), path.name
    parts = urlsplit(text)
    parent, _, name = parts.path.rstrip("/").rpartition("/")
    return urlunsplit((parts.scheme, parts.netloc, parent, "", "")), name


def join_key(*parts: str) -> str:
    """Join key parts with ``/``, dropping empty parts and doubled separators."""
    return "/".join(p.strip("/") for p in parts if p.strip("/"))
