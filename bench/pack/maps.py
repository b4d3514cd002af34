"""The no-op map of the ``--map`` rows (``bench.pack.maps:unchanged``): the cost of a map is then
shardpipe's alone, none of it the function's. Pack workers import this module: the standard library only."""

from __future__ import annotations

from typing import Any


def unchanged(sample: dict[str, Any]) -> dict[str, Any]:
    """The no-op map: every sample as it came."""
    return sample
