"""What a sample's key may be, wherever the sample comes from (a source's key column, a map's output, a
write from Python): a key that every format stores and webdataset reads back as the same key."""

from __future__ import annotations

import re
from typing import Any

from shardpipe.errors import DataError

KEY = "__key__"
"""The key's entry in a sample dict (webdataset's convention)."""


class SampleError(DataError):
    """A sample handed to the pack (a map's output, or a write) breaks the rules; the message says which."""


_BAD_PARTS = re.compile(r"(?:^|/)(?:\.\.?)?(?:/|$)|\x00")  # an empty, "." or ".." part, or a NUL


def check_key(key: Any) -> str:
    """A key that every format stores and webdataset reads back as the same key: a non-empty string of
    ``/``-separated parts, none empty or ``..``, the last one without a dot (webdataset's key ends at
    the first dot of a file name)."""
    if not isinstance(key, str) or not key:
        raise SampleError(f"{KEY} must be a non-empty string, got {key!r:.80}")
    if _BAD_PARTS.search(key):
        raise SampleError(f"key {key!r:.80}: parts must be non-empty, not '.' or '..', and hold no NUL")
    if "." in key.rpartition("/")[2]:
        raise SampleError(
            f"key {key!r:.80}: its last part holds a dot, where webdataset ends a key; use '_' or '-' instead"
        )
    return key
