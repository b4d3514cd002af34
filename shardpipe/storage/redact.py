"""No secret reaches a message or a log line: URLs lose user info, query string and fragment (where
signatures and tokens travel), and the values of secret-looking storage options are masked."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_URL_IN_TEXT = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_SECRET_WORDS = ("key", "secret", "token", "password", "credential", "session")


def redact_url(url: str) -> str:
    """``url`` without user info, query string or fragment; a plain path as it is."""
    parts = urlsplit(url)
    if not parts.scheme or len(parts.scheme) == 1:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


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
