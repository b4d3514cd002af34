"""Sources in object storage: a prefix listed as a tree, file-list cells that are URLs, and their bytes.

The rules are the local ones (``shardpipe.sources``): in a tree, files sharing a key form one sample and
the extension names the field; names starting with a dot (at any level) are skipped; a file with no dot
in its name is ignored. A sample's cell is the file's full URL, so the plan, the shard bytes and the
order are the same as for the same files on a local disk; only the recorded paths differ.

Bytes are fetched by the shard writers (:func:`fetch_cells`), many files at once on threads, each through
a store of the URL's bucket or host, so every read gets the seam's retries and its error messages. One
store per bucket or host per task: a filesystem object is never shared across a fork.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from shardpipe.errors import DataError
from shardpipe.storage import Store, open_store, redact_url

FETCH_THREADS = 16
"""Files fetched at once by one shard writer: small files are latency-bound, not bandwidth-bound."""


_task_stores: dict[tuple[int, str], Store] = {}


def task_store(store: Store) -> Store:
    """``store``, or an equal one (same root, options, retry policy) this process already uses.

    Shard tasks each get their stores afresh (unpickled, or made per task); a new filesystem object costs
    a session, credential resolution and a client, far more than a request, so a worker process keeps
    one per store for all its tasks. Keyed by pid: a forked child never reuses its parent's.
    """
    identity = f"{type(store).__qualname__}:{store.__reduce_ex__(2)[2]!r}"  # class and state: root, options
    return _task_stores.setdefault((os.getpid(), identity), store)


class Stores:
    """One store per bucket or host (a signed URL gets one of its own), made on first use."""

    def __init__(self, storage_options: Mapping[str, Any] | None) -> None:
        self._options = dict(storage_options or {})
        self._stores: dict[str, Store] = {}

    def locate(self, url: str) -> tuple[Store, str]:
        """The store holding ``url`` and the object's key in it."""
        parts = urlsplit(url)
        root, key = urlunsplit((parts.scheme, parts.netloc, "", "", "")), parts.path.lstrip("/")
        if parts.query:  # a signed URL names one object; keys cannot be joined to it
            root, key = url, ""
        if root not in self._stores:
            self._stores[root] = task_store(open_store(root, storage_options=self._options))
        return self._stores[root], key

    def size(self, url: str) -> int:
        store, key = self.locate(url)
        return store.size(key)

    def read(self, url: str) -> bytes:
        store, key = self.locate(url)
        return store.read(key)


def list_tree(root: str, storage_options: Mapping[str, Any] | None) -> tuple[dict[str, Any], int, str]:
    """Group the objects under ``root`` by key as ``scan_tree`` does; return (groups, ignored, display)."""
    store = open_store(root, storage_options=storage_options)
    grouped: dict[str, dict[str, tuple[str | bytes, int]]] = {}
    ignored = 0
    for key, size in store.list_sizes().items():
        parts = key.split("/")
        if any(part.startswith(".") for part in parts):
            continue
        stem, dot, field = parts[-1].partition(".")
        if not dot:
            ignored += 1
            continue
        grouped.setdefault(field, {})["/".join([*parts[:-1], stem])] = (store.url(key), size)
    return grouped, ignored, store.display


def read_list_bytes(url: str, storage_options: Mapping[str, Any] | None) -> bytes:
    """A file list's bytes, from a store."""
    store, key = Stores(storage_options).locate(url)
    return store.read(key)


def join_cell(list_url: str, value: str) -> str:
    """A file-list cell as a URL: a URL as it is, a relative path under the list's folder."""
    if "://" in value:
        return value
    parts = urlsplit(list_url)
    folder = parts.path.rsplit("/", 1)[0]
    return urlunsplit((parts.scheme, parts.netloc, f"{folder}/{value.lstrip('/')}", "", ""))


def sizes_of(urls: Sequence[str], storage_options: Mapping[str, Any] | None) -> list[int | DataError]:
    """Each URL's size (one request each, on threads), or the error that says why it has none."""
    stores = Stores(storage_options)
    for url in set(urls):
        stores.locate(url)  # made here, not racing in the threads

    def size(url: str) -> int | DataError:
        try:
            return stores.size(url)
        except DataError as exc:
            return exc

    with ThreadPoolExecutor(FETCH_THREADS) as pool:
        return list(pool.map(size, urls))


def fetch_cells(urls: Iterable[str], stores: Stores) -> list[bytes | DataError]:
    """Every URL's bytes (on threads), or the error that stopped its read, in the order given."""
    urls = list(urls)
    for url in urls:
        stores.locate(url)

    def read(url: str) -> bytes | DataError:
        try:
            return stores.read(url)
        except DataError as exc:
            return exc

    if len(urls) <= 1:
        return [read(url) for url in urls]
    with ThreadPoolExecutor(min(FETCH_THREADS, len(urls))) as pool:
        return list(pool.map(read, urls))


def shown(url: str) -> str:
    return redact_url(url)
