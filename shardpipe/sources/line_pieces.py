"""Cutting a text file (CSV, JSON Lines) into byte ranges whose lines are read by separate tasks.

The rule, which makes every line belong to exactly one piece whatever the cut points: a line is its bytes
up to and including its ``\\n`` (the last line may lack one), and it belongs to the piece ``[start, stop)``
that holds its first byte. A task given ``[start, stop)`` therefore reads from the first line start at or
after ``start`` (``start`` itself when it is 0 or follows a ``\\n``) through the end of the line holding
byte ``stop - 1``. Only ``\\n`` ends a line: a ``\\r\\n`` pair is split after its ``\\n`` like any other, a
bare ``\\r`` never splits, and a value must not contain a newline (pyarrow's own CSV default,
``newlines_in_values=False``, assumes the same). Pure functions over a ``read(start, stop)`` callable.
"""

from __future__ import annotations

from collections.abc import Callable

from shardpipe.errors import UsageError

Read = Callable[[int, int], bytes]
"""``read(start, stop)``: the file's bytes ``[start, stop)`` (fewer only at the end of the file)."""

_SCAN = 64 * 1024  # bytes read at a time while looking for the end of a line past a piece's end


def cut_ranges(size: int, piece_bytes: int) -> list[tuple[int, int]]:
    """``[0, size)`` cut every ``piece_bytes`` bytes; an empty file is one empty piece."""
    if piece_bytes < 1:
        raise UsageError(f"piece_bytes must be at least 1, got {piece_bytes}")
    if size <= 0:
        return [(0, 0)]
    return [(start, min(start + piece_bytes, size)) for start in range(0, size, piece_bytes)]


def owned_lines(read: Read, size: int, start: int, stop: int) -> bytes:
    """The whole lines whose first byte lies in ``[start, stop)`` (see the module rule), as one bytes."""
    if not 0 <= start <= stop <= size:
        raise UsageError(f"piece [{start}, {stop}) must lie within [0, {size}]")
    if start == stop:
        return b""
    before = max(start - 1, 0)
    data = read(before, stop)  # one byte before: does `start` follow a newline?
    if start == 0:
        first = 0
    else:
        newline = data.find(b"\n", 0, stop - 1 - before)  # a newline at stop-1 starts a line past stop
        if newline < 0:
            return b""  # the line holding `start` began earlier and runs past this piece
        first = newline + 1
    if data.endswith(b"\n"):
        return data[first:]
    return data[first:] + _to_line_end(read, size, stop)  # the line holding stop-1 goes on


def first_line(read: Read, size: int) -> bytes:
    """The file's first line with its newline (a CSV header, which every piece's task parses)."""
    return _to_line_end(read, size, 0)


def _to_line_end(read: Read, size: int, position: int) -> bytes:
    """The bytes from ``position`` through the next ``\n`` (or the end of the file)."""
    parts = []
    while position < size:
        more = read(position, min(position + _SCAN, size))
        if not more:
            break
        newline = more.find(b"\n")
        if newline >= 0:
            parts.append(more[: newline + 1])
            break
        parts.append(more)
        position += len(more)
    return b"".join(parts)
