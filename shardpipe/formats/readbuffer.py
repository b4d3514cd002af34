"""One growable byte buffer that readers reuse, read after read.

A fresh buffer per read costs a page fault per 4 KiB; a reader (or a dataset's windows) keeps one and
reads into its first bytes. A leaf, so the interface (:mod:`.base`) can name it without importing a reader.
"""

from __future__ import annotations


class ReadBuffer:
    """One buffer reused by every read of a reader (or of a dataset's windows), grown as needed: a fresh
    buffer per read costs a page fault per 4 KiB."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data = bytearray()

    def view(self, size: int, *, keep: int = 0) -> memoryview:
        """The first ``size`` bytes; a larger buffer replaces the old one (views of it stay valid). A
        buffer filled piece by piece passes the bytes written so far as ``keep``: they are copied over,
        and the buffer at least doubles, so the copies cost no more than the pieces."""
        if size > len(self._data):
            old, self._data = self._data, bytearray(max(size, 2 * keep))
            self._data[:keep] = old[:keep]
        return memoryview(self._data)[:size]
