"""Sizes as people write them: ``256MB``, ``64KiB``, ``1.5 GiB`` or a plain number of bytes.

Part of the shared core (``shardpipe.manifest``, ``.shardtable``, ``.errors``, ``.formats``, ``.storage``,
``.units``), which the pack stage (``shardpipe.packing``) and the loaders (``loaders``) both stand on: it
imports neither of them, nor the sources, tools or CLI (the import-linter contracts in pyproject.toml, run
by ``make lint``).
"""

from __future__ import annotations

import re

from shardpipe.errors import UsageError

_UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9}  # K, M, G: short for KB, MB, GB
_UNITS |= {f"{prefix}B": 1000**power for power, prefix in enumerate("KMGT", start=1)}
_UNITS |= {f"{prefix}IB": 1024**power for power, prefix in enumerate("KMGT", start=1)}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")


def parse_size(value: int | str) -> int:
    """Bytes from an int or a string: ``"256MB"`` -> 256_000_000, ``"64KiB"`` -> 65_536 (KB = 1000,
    KiB = 1024; K, M, G are KB, MB, GB); must be positive."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        match = _SIZE.fullmatch(str(value))
        if match is None or match[2].upper() not in _UNITS:
            raise UsageError(
                f"size {value!r} is not understood; write bytes or a number with a unit "
                "(KB, MB, GB, TB = powers of 1000; KiB, MiB, GiB, TiB = powers of 1024), e.g. 256MB"
            )
        size = int(float(match[1]) * _UNITS[match[2].upper()])
    if size <= 0:
        raise UsageError(f"size {value!r} must be positive")
    return size


def format_size(num_bytes: int) -> str:
    """``1234567`` -> ``"1.2 MB"``: decimal units, as :func:`parse_size` reads them."""
    size = float(num_bytes)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")
