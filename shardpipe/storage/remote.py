"""Object-store access through fsspec (s3fs, gcsfs, HTTP): retries, error mapping, verified uploads.

Invariants:
- Each process makes its own filesystem objects (fsspec's instance cache skipped), so no event loop or
  connection pool crosses a fork into a DataLoader worker; a pickled store carries only its root and
  options. Stores of one process with equal options share one (:func:`_filesystem`): a client costs far
  more than a request to build, and a job opens several stores of one bucket (splits, sources, caches).
- Transient failures are retried by the libraries' own machinery where they have it (botocore's retry
  config for S3, gcsfs's own retries for GCS) and by tenacity for HTTP, whose aiohttp client has none.
  Every call also has a deadline (``operation_timeout_s``, enforced and cancelled by fsspec): a client
  stuck mid-protocol (aiohttp waiting on a ``100-continue`` answer that a slow server sent late) becomes
  a retried timeout instead of a hang. 403 and 404 are never retried.
- An upload is read back and its sha256 compared before ``put`` returns: an object store shows an object
  whole or not at all, so the final name never holds a partial object, and the read-back catches one
  that arrived damaged (it is removed and uploaded again, then ``CorruptShardError``).
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast
from urllib.parse import urlsplit

import fsspec
import tenacity
from fsspec.exceptions import FSTimeoutError
from fsspec.utils import tokenize

from shardpipe.errors import CorruptShardError, DataError, UsageError
from shardpipe.storage.base import (
    AccessDeniedError,
    ObjectNotFoundError,
    RetryPolicy,
    StorageError,
    StorageUnavailableError,
    join_key,
)
from shardpipe.storage.files import sha256_file
from shardpipe.storage.ranges import coalesce_ranges, slice_blocks
from shardpipe.storage.redact import redact_url, scrub

log = logging.getLogger("shardpipe.storage")
T = TypeVar("T")

#: Bytes per ranged GET when streaming an object: each request is retried on its own.
STREAM_CHUNK = 8 * 1024 * 1024
#: Staging folders (``tempfile``, under ``TMPDIR``) start with this.
STAGING_PREFIX = "shardpipe-stage-"
#: Uploads whose read-back does not match are tried this many times in all.
UPLOAD_ATTEMPTS = 3
#: Requests one S3 filesystem object has in flight at once (botocore's default is 10): a random batch of
#: 64 samples is 64 ranged GETs, each mostly waiting on the store's latency.
MAX_CONNECTIONS = 64
_HTTP = ("http", "https")
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TRANSIENT_WORDS = ("SlowDown", "Throttl", "InternalError", "ServiceUnavailable", "RequestTimeout", "reset")


_FILESYSTEMS = 8
"""Filesystem objects a process keeps for its stores to share; the least recently used goes first."""
_filesystems: OrderedDict[str, Any] = OrderedDict()
_filesystems_lock = threading.Lock()


def _forget_filesystems() -> None:
    """A forked child starts with none (its parent's belong to the parent's event loop) and a fresh lock
    (a thread of the parent may have held it)."""
    global _filesystems_lock
    _filesystems.clear()
    _filesystems_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_filesystems)


def _filesystem(protocol: str, options: Mapping[str, Any]) -> Any:
    """This process's filesystem object for ``protocol`` and ``options``: the one an earlier store with
    equal ones made, else a new one, kept for the next."""
    key = tokenize(protocol, options)
    with _filesystems_lock:
        if (fs := _filesystems.get(key)) is None:
            fs = _filesystems[key] = fsspec.filesystem(protocol, skip_instance_cache=True, **options)
            while len(_filesystems) > _FILESYSTEMS:
                _filesystems.popitem(last=False)
        _filesystems.move_to_end(key)
        return fs


class FsspecStore:
    """A store rooted at an ``s3://``, ``gs://`` or ``http(s)://`` prefix (see ``storage.Store``)."""

    def __init__(self, root: str, storage_options: Mapping[str, Any], retry: RetryPolicy):
        self._root = root.rstrip("/")
        self._protocol = urlsplit(root).scheme.lower()
        self._options = dict(storage_options)
        self._retry = retry
        self._fs: Any = None
        self._pid = -1
        self._deadline = retry.operation_timeout_s

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self._root, "options": self._options, "retry": self._retry}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], state["options"], state["retry"])  # type: ignore[misc]

    @property
    def root(self) -> str:
        return self._root

    @property
    def display(self) -> str:
        return redact_url(self._root)

    @property
    def fs(self) -> Any:
        """This process's filesystem object; a forked child builds its own on first use."""
        if self._fs is None or self._pid != os.getpid():
            self._fs = _filesystem(self._protocol, self._fs_options())
            self._pid = os.getpid()
        return self._fs

    def local_path(self, key: str = "") -> Path | None:
        return None

    def url(self, key: str = "") -> str:
        if not join_key(key):
            return self._root
        if urlsplit(self._root).query:
            raise UsageError(f"{self.display} is a signed URL naming one object; no key can be joined to it")
        return f"{self._root}/{join_key(key)}"

    def exists(self, key: str) -> bool:
        return bool(self._call("check", key, lambda u: self.fs.exists(u, timeout=self._deadline)))

    def size(self, key: str) -> int:
        size = self._call("stat", key, lambda u: self.fs.size(u, timeout=self._deadline))
        if size is None:
            raise StorageError(
                f"{redact_url(self.url(key))} reports no size; the server must send Content-Length",
                redact_url(self.url(key)),
            )
        return int(size)

    def list_keys(self, prefix: str = "") -> list[str]:
        found = self._call("list", prefix, lambda u: self.fs.find(u, timeout=self._deadline))
        base = self.fs._strip_protocol(self._root).rstrip("/")
        return sorted(self.fs._strip_protocol(p)[len(base) :].lstrip("/") for p in found)

    def list_sizes(self, prefix: str = "") -> dict[str, int]:
        found = self._call("list", prefix, lambda u: self.fs.find(u, detail=True, timeout=self._deadline))
        base = self.fs._strip_protocol(self._root).rstrip("/")
        sizes = {}
        for path, info in found.items():
            key = self.fs._strip_protocol(path)[len(base) :].lstrip("/")
            size = info.get("size")  # an HTTP listing may give none: then one HEAD for it
            sizes[key] = int(size) if size is not None else self.size(key)
        return dict(sorted(sizes.items()))

    def open(self, key: str) -> BinaryIO:
        return cast(BinaryIO, self._call("open", key, lambda u: self.fs.open(u, "rb")))

    def read(self, key: str) -> bytes:
        return bytes(self._call("read", key, lambda u: self.fs.cat_file(u, timeout=self._deadline)))

    def read_range(self, key: str, start: int, stop: int) -> bytes:
        data: bytes = self.read_ranges(key, [(start, stop)])[0]
        return data

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        blocks, block_of = coalesce_ranges(ranges)
        todo = [(start, stop) for start, stop in blocks if stop > start]
        if not todo:
            return [b"" for _ in ranges]

        def fetch(url: str) -> list[bytes]:
            starts, stops = [s for s, _ in todo], [e for _, e in todo]
            return list(
                self.fs.cat_ranges([url] * len(todo), starts, stops, on_error="raise", timeout=self._deadline)
            )

        fetched = iter(self._call("read", key, fetch))
        data = [next(fetched) if stop > start else b"" for start, stop in blocks]
        return slice_blocks(ranges, blocks, block_of, data)

    def iter_chunks(self, key: str, size: int, chunk_size: int = STREAM_CHUNK) -> Iterator[bytes]:
        """The object's first ``size`` bytes, one retried ranged GET per chunk."""
        for start in range(0, size, chunk_size):
            yield self.read_range(key, start, min(size, start + chunk_size))

    def sha256(self, key: str) -> tuple[str, int]:
        """``(sha256, size)`` of the object as the store serves it now."""
        size = self.size(key)
        digest = hashlib.sha256()
        for chunk in self.iter_chunks(key, size):
            digest.update(chunk)
        return digest.hexdigest(), size

    def put(self, key: str, data: bytes, *, sha256: str | None = None) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if sha256 is not None and sha256 != digest:
            raise CorruptShardError.at(
                self.display, f"data to upload as {key} has sha256 {digest}, expected {sha256}"
            )
        return self._upload(key, digest, lambda u: self.fs.pipe_file(u, data, timeout=self._deadline))

    def put_file(self, key: str, source: Path, *, sha256: str | None = None) -> str:
        digest = sha256 or sha256_file(source)
        return self._upload(key, digest, lambda u: self.fs.put_file(str(source), u, timeout=self._deadline))

    def move(self, source: str, key: str) -> None:
        self._call("copy", source, lambda u: self.fs.copy(u, self.url(key), timeout=self._deadline))
        self.remove(source)

    def append(self, key: str, data: bytes) -> None:
        """Read the object (if any) and write it again with ``data`` at its end: no object store appends."""
        try:
            before = self.read(key)
        except ObjectNotFoundError:
            before = b""
        self.put(key, before + data)

    @contextmanager
    def staging(self, key: str) -> Iterator[Path]:
        """A file in a fresh temporary folder of this process's (``TMPDIR``), removed with it."""
        with tempfile.TemporaryDirectory(prefix=STAGING_PREFIX) as folder:
            yield Path(folder, key.rsplit("/", 1)[-1])

    def publish(self, key: str, staged: Path, sha256: str) -> None:
        self.put_file(key, staged, sha256=sha256)

    def remove_temporaries(self) -> int:
        return 0  # an upload is whole or absent: nothing is left under a temporary name

    def remove(self, key: str, *, missing_ok: bool = True) -> None:
        if not missing_ok and not self.exists(key):  # S3 answers a DELETE of a missing key with success
            shown = redact_url(self.url(key))
            raise ObjectNotFoundError(f"remove {shown}: no such object", shown)
        try:
            self._call("remove", key, lambda u: self.fs.rm_file(u, timeout=self._deadline))
        except ObjectNotFoundError:
            if not missing_ok:
                raise

    def _upload(self, key: str, digest: str, send: Callable[[str], object]) -> str:
        for attempt in range(1, UPLOAD_ATTEMPTS + 1):
            self._call("upload", key, send)
            found, _ = self.sha256(key)
            if found == digest:
                return digest
            log.warning(
                "upload of %s read back with a different sha256 (attempt %d of %d)",
                redact_url(self.url(key)),
                attempt,
                UPLOAD_ATTEMPTS,
            )
            self.remove(key)
        raise CorruptShardError.at(
            redact_url(self.url(key)),
            f"uploaded {UPLOAD_ATTEMPTS} times, each read "
            f"back with a sha256 other than {digest}; the object was removed",
        )

    def _call(self, what: str, key: str, fn: Callable[[str], T]) -> T:
        url = self.url(key)
        try:
            return self._retrying(what, url)(fn, url)
        except DataError:
            raise
        except Exception as exc:  # every backend's errors are translated here, and only here
            raise self._translate(exc, what, url) from None

    def _retrying(self, what: str, url: str) -> tenacity.Retrying:
        """HTTP: every transient failure. S3 and GCS retry those themselves; here only the deadline."""
        policy = self._retry
        retry_if = is_transient if self._protocol in _HTTP else _past_deadline

        def note(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning(
                "%s %s failed (%s), attempt %d of %d; retrying",
                what,
                redact_url(url),
                type(exc).__name__,
                state.attempt_number,
                policy.max_attempts,
            )

        return tenacity.Retrying(
            stop=tenacity.stop_after_attempt(policy.max_attempts),
            wait=tenacity.wait_random_exponential(multiplier=policy.backoff_s, max=policy.max_backoff_s),
            retry=tenacity.retry_if_exception(retry_if),
            before_sleep=note,
            reraise=True,
        )

    def _translate(self, exc: BaseException, what: str, url: str) -> StorageError:
        shown = redact_url(url)
        status = _status(exc)
        detail = f"{type(exc).__name__}: {scrub(str(exc), self._options)}"
        if isinstance(exc, FileNotFoundError) or status == 404:
            return ObjectNotFoundError(
                f"{what} {shown}: no such object (404); check the bucket or host, "
                "the key, and that the dataset was written there",
                shown,
            )
        if isinstance(exc, PermissionError) or status in (401, 403):
            return AccessDeniedError(
                f"{what} {shown}: access denied ({status or 403}); check the credentials "
                "(environment, profile, instance role or storage_options) and the "
                "bucket's policy",
                shown,
            )
        if is_transient(exc):
            return StorageUnavailableError(
                f"{what} {shown} still failing after the retry limit "
                f"({self._retry.max_attempts} attempts): {detail}",
                shown,
            )
        return StorageError(f"{what} {shown} failed: {detail}", shown)

    def _fs_options(self) -> dict[str, Any]:
        """Our retry and timeout defaults under the caller's ``storage_options`` (the caller wins)."""
        policy, options = self._retry, dict(self._options)
        if self._protocol in ("s3", "gs", "gcs"):
            # A listing cached by the filesystem goes stale when another process writes the prefix (a
            # resumed pack, an index run); its answers then contradict the store. Off unless asked for.
            options.setdefault("use_listings_cache", False)
        if self._protocol == "s3":
            config = {
                "retries": {"total_max_attempts": policy.max_attempts, "mode": "standard"},
                "connect_timeout": policy.connect_timeout_s,
                "read_timeout": policy.read_timeout_s,
                "max_pool_connections": MAX_CONNECTIONS,
            }
            options["config_kwargs"] = {**config, **options.get("config_kwargs", {})}
        elif self._protocol in _HTTP:
            import aiohttp  # only HTTP needs it

            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=policy.connect_timeout_s, sock_read=policy.read_timeout_s
            )
            options["client_kwargs"] = {"timeout": timeout, **options.get("client_kwargs", {})}
        return options


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying: resets, timeouts, 5xx, throttling; never 403 or 404."""
    status = _status(exc)
    if status is not None:
        return status in _TRANSIENT_STATUS
    if isinstance(exc, (FileNotFoundError, PermissionError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
        return True
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - aiohttp is a dependency
        return False
    if isinstance(exc, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)):
        return True
    if isinstance(exc, OSError) and exc.errno in (errno.EIO, errno.ECONNRESET, errno.ETIMEDOUT):
        return any(word.lower() in str(exc).lower() for word in _TRANSIENT_WORDS)
    return False


def _past_deadline(exc: BaseException) -> bool:
    """A call outlived ``operation_timeout_s`` (a client stuck mid-protocol); fsspec cancelled it."""
    return isinstance(exc, FSTimeoutError)


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(code) if code is not None else None
    return None
