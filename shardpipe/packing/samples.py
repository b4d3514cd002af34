"""Samples in webdataset's convention, as a map or the Python writer hands them over, and their checks.

A sample is a dict: ``{"__key__": "cat/0001", "jpg": b"...", "cls": b"3"}``: the key, then one entry per
field, the field's name (a file extension) mapping to its bytes. What a map returns (a sample, ``None``
to drop it, or a list of samples) is checked here before any of it is written, so a bad output is named
by its key, never half-written into a shard.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardpipe.sources.keys import KEY, SampleError, check_key

__all__ = ["KEY", "Sample", "SampleError", "check_key", "check_outputs", "check_sample"]

Sample = dict[str, Any]


def check_sample(sample: Any) -> tuple[str, dict[str, bytes]]:
    """``(key, fields)`` of one sample, every value as ``bytes``; raises :class:`SampleError`."""
    if type(sample) is not dict and not isinstance(sample, Mapping):
        raise SampleError(f"a sample must be a dict with {KEY!r} and fields, got {type(sample).__name__}")
    key = check_key(sample.get(KEY))
    fields: dict[str, bytes] = {}
    for name, value in sample.items():
        if name == KEY:
            continue
        usual = type(value) is bytes and type(name) is str and name[:1] not in ("", "_")
        if usual and "/" not in name and "\0" not in name:  # checked with the fewest calls
            fields[name] = value
            continue
        if not isinstance(name, str) or not name or name.startswith("__") or "/" in name or "\0" in name:
            raise SampleError(
                f"sample {key!r}: field name {name!r:.40} must be a non-empty string without '/' that does "
                "not start with '__' (those names are the loaders')"
            )
        if isinstance(value, bytes):
            fields[name] = value
        elif isinstance(value, (bytearray, memoryview)):
            fields[name] = bytes(value)
        else:
            hint = "; encode it, e.g. str(label).encode()" if isinstance(value, (str, int, float)) else ""
            raise SampleError(
                f"sample {key!r}: field {name!r} is {type(value).__name__}, expected bytes{hint}"
            )
    if not fields:
        raise SampleError(f"sample {key!r} has no fields")
    return key, fields


def check_outputs(result: Any) -> list[tuple[str, dict[str, bytes]]]:
    """What a map returned for one input: a sample, ``None`` (dropped) or a list of samples, checked."""
    if result is None:
        return []
    if type(result) is dict or isinstance(result, Mapping):
        return [check_sample(result)]
    if isinstance(result, (list, tuple)):
        outputs = [check_sample(sample) for sample in result]
        keys = [key for key, _ in outputs]
        if len(set(keys)) != len(keys):
            duplicate = next(key for key in keys if keys.count(key) > 1)
            raise SampleError(f"the samples returned for one input share the key {duplicate!r}")
        return outputs
    raise SampleError(
        f"a map must return a sample (dict), None or a list of samples, got {type(result).__name__}"
    )
