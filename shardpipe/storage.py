"""The storage seam: one interface over a local folder or an object-store prefix.

``open_store(url)`` turns a plain path, ``file://``, ``s3://``, ``gs://`` or ``http(s)://`` URL into a
:class:`Store` rooted there; callers address objects by keys relative to that root with ``/`` separators
(the manifest's own paths). Everything above this module reads and writes bytes and never knows where they
live.

Invariants:
- Local paths take a direct path (``os`` calls, ``pread``); fsspec is not even imported for them.
- ``put`` never leaves partial content under a final name: locally a temporary name is flushed and
  renamed; an object store shows an object whole or not at all, and the upload is read back and checked
  against its sha256 before ``put`` returns.
- Errors are :class:`StorageError` (a ``DataError``) naming the URL with credentials, query string and
  fragment stripped; no secret reaches a message or a log line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

from shardpipe.errors import DataError, UsageError

T = TypeVar("T")
REMOTE_SCHEMES = ("s3", "gs", "gcs", "http", "https")


class StorageError(DataError):
    """A storage operation failed; ``url`` is the redacted address it concerned."""

    def __init__(self, message: str, url: str):
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
    """Operations shardpipe needs on a dataset root; ``key`` is relative to it, ``/``-separated."""

    @property
    def root(self) -> str:
        """The root as given (may carry credentials: never print it; use ``display``)."""
        ...

    @property
    def display(self) -> str:
        """The root, safe to print."""
        ...

    def local_path(self, key: str = "") -> Path | None:
        """The local file behind ``key``, or None for a remote store (callers then use the cache)."""
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
    def put(self, key: str, data: bytes, *, sha256: str | None = None) -> str: ...
    def put_file(self, key: str, source: Path, *, sha256: str | None = None) -> str: ...
    def remove(self, key: str, *, missing_ok: bool = True) -> None: ...


def is_remote(url: str | os.PathLike[str]) -> bool:
    return isinstance(url, str) and urlsplit(url).scheme.lower() in REMOTE_SCHEMES


def as_location(where: str | os.PathLike[str]) -> Path | str:
    """A path argument as shardpipe handles it: a remote URL stays a string, a ``file://`` URL or a plain
    path becomes a ``Path``."""
    if is_remote(where):
        return str(where)
    text = os.fspath(where)
    return Path(urlsplit(text).path) if text.startswith("file://") else Path(text)


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
            from shardpipe.fsspec_store import FsspecStore  # imported here: keeps fsspec off local paths

            return FsspecStore(url, storage_options or {}, retry or RetryPolicy())
        if scheme == "file":
            return _local(urlsplit(url).path)
        if len(scheme) > 1:  # a one-letter scheme is a Windows drive, a path
            raise UsageError(
                f"unsupported URL scheme {scheme!r} in {redact_url(url)}; use a path or one of "
                f"file, {', '.join(REMOTE_SCHEMES)}"
            )
    return _local(url)


def _local(path: str | os.PathLike[str]) -> Store:
    from shardpipe.local_store import LocalStore  # imported here: it imports this module's errors

    return LocalStore(Path(path))


def split_url(url: str | os.PathLike[str]) -> tuple[str, str]:
    """``(parent, name)`` of a file URL or path, so ``open_store(parent).read(name)`` reads it."""
    text = os.fspath(url)
    if not is_remote(text):
        path = Path(text.removeprefix("file://") if text.startswith("file://") else text)
        return str(path.parent), path.name
    parts = urlsplit(text)
    parent, _, name = parts.path.rstrip("/").rpartition("/")
    return urlunsplit((parts.scheme, parts.netloc, parent, "", "")), name


def download(store: Store, key: str, dest: Path) -> int:
    """Copy one object to the local file ``dest`` (its folder made), chunk by chunk; return its size."""
    size = store.size(key)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as f:
        for chunk in store.iter_chunks(key, size):
            f.write(chunk)
    return size


def join_key(*parts: str) -> str:
    """Join key parts with ``/``, dropping empty parts and doubled separators."""
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


def redact_url(url: str) -> str:
    """``url`` without user info, query string or fragment (where signatures and tokens travel)."""
    parts = urlsplit(url)
    if not parts.scheme or len(parts.scheme) == 1:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


_URL_IN_TEXT = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_SECRET_WORDS = ("key", "secret", "token", "password", "credential", "session")


def scrub(text: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """``text`` with every URL redacted and every secret-looking option value masked."""
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    for value in _secret_values(storage_options or {}):
        text = text.replace(value, "***")
    return text


def _secret_values(options: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    for name, value in options.items():
        if isinstance(value, Mapping):
            found += _secret_values(value)
        elif isinstance(value, str) and len(value) >= 4 and any(w in name.lower() for w in _SECRET_WORDS):
            found.append(value)
    return found


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
