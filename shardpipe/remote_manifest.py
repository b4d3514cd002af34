"""Manifests at a URL: a dataset folder URL or a manifest URL, read through the storage seam.

The same checks as a local manifest (``shardpipe.manifest.manifest_from_text``); messages name the URL
without credentials or query string.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardpipe.errors import DataError
from shardpipe.manifest import MANIFEST_NAME, Manifest, manifest_from_text, warn_v1
from shardpipe.storage import ObjectNotFoundError, Store, open_store, redact_url, split_url


def manifest_location(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Store, str]:
    """The dataset root's store and the manifest's key in it, for a dataset folder URL or a manifest URL
    (one whose last part ends in ``.json``)."""
    if url.rstrip("/").rsplit("/", 1)[-1].split("?")[0].endswith(".json"):
        parent, name = split_url(url)
        return open_store(parent, storage_options=storage_options), name
    return open_store(url, storage_options=storage_options), MANIFEST_NAME


def load_remote_manifest(url: str, storage_options: Mapping[str, Any] | None) -> Manifest:
    store, key = manifest_location(url, storage_options)
    shown = redact_url(store.url(key))
    try:
        data = store.read(key)
    except ObjectNotFoundError as exc:
        raise DataError(
            f"no manifest at {shown}; check the URL, or pack the data there with `shardpipe pack` first"
        ) from exc
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise DataError(f"cannot read manifest {shown}: {exc}") from None
    manifest = manifest_from_text(text, shown)
    if manifest.manifest_version < 2:
        warn_v1(shown, shown, manifest.manifest_version)
    return manifest
