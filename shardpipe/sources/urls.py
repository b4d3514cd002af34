"""Cells that are URLs (a file list's, or a remote tree's): their stores, their sizes and their bytes.

Bytes are fetched by the shard writers (:func:`fetch_cells`), many files at once on threads, each through
a store of the URL's bucket or host, so every read gets the seam's retries and its error messages. One
store per bucket or host per task (stores of one process share its filesystem objects, none crosses a
fork).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from shardpipe.errors import DataError
from shardpipe.storage import Store, open_store

FETCH_THREADS = 16
"""Files fetched at once by one shard writer: small files are latency-bound, not bandwidth-bound."""


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
            self._stores[root] = open_store(root, storage_options=self._options)
        return self._stores[root], key

    def size(self, url: str) -> int:
        store, key = self.locate(url)
        return store.size(key)

    def read(self, url: str) -> bytes:
        store, key = self.locate(url)
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
