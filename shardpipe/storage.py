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

import hashlib
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

from shardpipe.atomic import publish, temp_path
from shardpipe.errors import CorruptShardError, DataError, UsageError

T = TypeVar("T")
REMOTE_SCHEMES = ("s3", "gs", "gcs", "http", "https")
#: Neighbouring ranges closer than this are fetched as one request: a request costs a round trip.
DEFAULT_MAX_GAP = 64 * 1024
#: A coalesced request never spans more than this, so one sparse read does not pull a whole shard.
DEFAULT_MAX_BLOCK = 16 * 1024 * 1024
_CHUNK = 1 << 20


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
            return LocalStore(Path(urlsplit(url).path))
        if len(scheme) > 1:  # a one-letter scheme is a Windows drive, a path
            raise UsageError(
                f"unsupported URL scheme {scheme!r} in {redact_url(url)}; use a path or one of "
                f"file, {', '.join(REMOTE_SCHEMES)}"
            )
    return LocalStore(Path(url))


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


def coalesce_ranges(
    ranges: Sequence[tuple[int, int]], max_gap: int = DEFAULT_MAX_GAP, max_block: int = DEFAULT_MAX_BLOCK
) -> tuple[list[tuple[int, int]], list[int]]:
    """Merge neighbouring ``[start, stop)`` ranges: ``(blocks, block_of)``, ``block_of[i]`` for range i.

    Ranges at most ``max_gap`` apart (or overlapping) share a block unless it would pass ``max_block``
    bytes; one range longer than ``max_block`` still gets a block of its own.
    """
    for start, stop in ranges:
        if not 0 <= start <= stop:
            raise UsageError(f"byte range ({start}, {stop}) is invalid; need 0 <= start <= stop")
    order = sorted(range(len(ranges)), key=lambda i: ranges[i])
    blocks: list[tuple[int, int]] = []
    block_of = [0] * len(ranges)
    for i in order:
        start, stop = ranges[i]
        if blocks:
            first, last = blocks[-1]
            if start <= last + max_gap and max(last, stop) - first <= max_block:
                blocks[-1] = (first, max(last, stop))
                block_of[i] = len(blocks) - 1
                continue
        blocks.append((start, stop))
        block_of[i] = len(blocks) - 1
    return blocks, block_of


def slice_blocks(
    ranges: Sequence[tuple[int, int]],
    blocks: Sequence[tuple[int, int]],
    block_of: Sequence[int],
    data: Sequence[bytes],
) -> list[bytes]:
    """Cut each range back out of the bytes fetched for its block."""
    out = []
    for (start, stop), b in zip(ranges, block_of, strict=True):
        first = blocks[b][0]
        out.append(data[b][start - first : stop - first])
    return out


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


class LocalStore:
    """A folder on this machine: plain ``os`` calls, atomic puts by temporary name + fsync + rename."""

    def __init__(self, root: Path):
        self._root = Path(root)

    @property
    def root(self) -> str:
        return str(self._root)

    @property
    def display(self) -> str:
        return str(self._root)

    def local_path(self, key: str = "") -> Path:
        return self._root / key if key else self._root

    def url(self, key: str = "") -> str:
        return str(self.local_path(key))

    def exists(self, key: str) -> bool:
        return self.local_path(key).exists()

    def size(self, key: str) -> int:
        return self._call(key, lambda p: p.stat().st_size)

    def list_keys(self, prefix: str = "") -> list[str]:
        base = self.local_path(prefix)
        if base.is_file():
            return [prefix]
        if not base.is_dir():
            return []
        return sorted(p.relative_to(self._root).as_posix() for p in base.rglob("*") if p.is_file())

    def open(self, key: str) -> BinaryIO:
        return self._call(key, lambda p: p.open("rb"))

    def read(self, key: str) -> bytes:
        return self._call(key, lambda p: p.read_bytes())

    def read_range(self, key: str, start: int, stop: int) -> bytes:
        return self.read_ranges(key, [(start, stop)])[0]

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        blocks, block_of = coalesce_ranges(ranges)

        def read_blocks(path: Path) -> list[bytes]:
            fd = os.open(path, os.O_RDONLY)
            try:
                return [os.pread(fd, stop - start, start) for start, stop in blocks]
            finally:
                os.close(fd)

        return slice_blocks(ranges, blocks, block_of, self._call(key, read_blocks))

    def iter_chunks(self, key: str, size: int, chunk_size: int = _CHUNK) -> Iterator[bytes]:
        """The file's first ``size`` bytes in chunks (fewer if it is shorter)."""
        with self.open(key) as f:
            remaining = size
            while remaining > 0 and (chunk := f.read(min(chunk_size, remaining))):
                remaining -= len(chunk)
                yield chunk

    def sha256(self, key: str) -> tuple[str, int]:
        digest, size = hashlib.sha256(), 0
        with self.open(key) as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
        return digest.hexdigest(), size

    def put(self, key: str, data: bytes, *, sha256: str | None = None) -> str:
        digest = hashlib.sha256(data).hexdigest()
        _check_digest(self.url(key), digest, sha256)
        final = self.local_path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        temp = temp_path(final)
        temp.write_bytes(data)
        publish(temp, final)
        return digest

    def put_file(self, key: str, source: Path, *, sha256: str | None = None) -> str:
        final = self.local_path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        temp = temp_path(final)
        digest = hashlib.sha256()
        with open(source, "rb") as src, open(temp, "wb") as dst:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                dst.write(chunk)
        try:
            _check_digest(str(source), digest.hexdigest(), sha256)
        except DataError:
            temp.unlink()
            raise
        publish(temp, final)
        return digest.hexdigest()

    def remove(self, key: str, *, missing_ok: bool = True) -> None:
        path = self.local_path(key)
        if path.is_dir():
            shutil.rmtree(path)
            return
        self._call(key, lambda p: p.unlink(missing_ok=missing_ok))

    def _call(self, key: str, fn: Callable[[Path], T]) -> T:
        path = self.local_path(key)
        try:
            return fn(path)
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"no file at {path}; check the path", str(path)) from exc
        except PermissionError as exc:
            raise AccessDeniedError(f"permission denied reading {path}; check its mode", str(path)) from exc


def _check_digest(where: str, actual: str, expected: str | None) -> None:
    if expected is not None and actual != expected:
        raise CorruptShardError(where, f"sha256 {actual} does not match the expected {expected}")
