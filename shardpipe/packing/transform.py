"""What runs on every sample at pack time, and what identifies it in the job.

A user map is ``fn(sample) -> sample | None | list[sample]`` over samples in webdataset's convention
(:mod:`.samples`), given as a callable or as ``"package.module:function"``; the built-in image preparation
(:mod:`.images`) runs on what it returns. The map's identity (qualified name, a hash of its source, a
declared version) is part of the job, so a resume with another map refuses, saying what differs.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from shardpipe.errors import UsageError
from shardpipe.packing.images import ImagePreparation
from shardpipe.packing.samples import KEY, Sample, check_outputs

OnError = Literal["raise", "skip"]


@dataclass(frozen=True, slots=True)
class Transform:
    """What runs on every sample at pack time: the user's map, then the built-in image preparation.

    Pickles as the map's reference (or its ``module:function`` text) and the image settings, so any
    executor runs it."""

    map: Callable[[Sample], Any] | str | None = None
    images: ImagePreparation | None = None

    def bind(self, *, sound_inputs: bool = False) -> Callable[[Any], list[tuple[str, dict[str, bytes]]]]:
        """The per-input function, the map resolved once: ``input -> [(key, fields), ...]`` checked.

        ``sound_inputs``: the inputs are samples of a source, already sound, so one the map returns as
        it came (the same dict, nothing in it changed) needs no check."""
        function = resolve(self.map) if self.map is not None else None
        images = self.images

        def apply(given: Any) -> list[tuple[str, dict[str, bytes]]]:
            before = given.copy() if sound_inputs else None
            made = function(given) if function is not None else given
            if before is not None and made is given and made == before:  # values compared by identity first
                del before[KEY]  # our own copy: its fields, with no dict built again
                outputs = [(given[KEY], before)]
            else:
                outputs = check_outputs(made)
            return outputs if images is None else [(key, images(fields)) for key, fields in outputs]

        return apply


def resolve(spec: Callable[[Sample], Any] | str) -> Callable[[Sample], Any]:
    """The function ``spec`` names: a callable as it is, or ``"package.module:function"`` imported."""
    if callable(spec):
        return spec
    module_name, colon, name = spec.partition(":")
    if not colon or not module_name or not name:
        raise UsageError(f"map {spec!r} must be given as package.module:function")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"map {spec!r}: cannot import {module_name!r} ({exc}); it must be importable by every worker "
            "(installed, or on PYTHONPATH)"
        ) from exc
    for part in name.split("."):
        target = getattr(target, part, None)
    if not callable(target):
        raise UsageError(f"map {spec!r}: {module_name} has no function {name!r}")
    function: Callable[[Sample], Any] = target
    return function


def map_identity(spec: Callable[[Sample], Any] | str, version: str | None) -> dict[str, Any]:
    """What identifies a map in the job: its qualified name, a sha256 of its source and the version the
    user declared (the only way to tell apart two maps whose source is not available, e.g. C functions)."""
    function = resolve(spec)
    target = function if inspect.isfunction(function) or inspect.ismethod(function) else type(function)
    name = f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"
    try:
        source: str | None = hashlib.sha256(inspect.getsource(target).encode()).hexdigest()
    except (OSError, TypeError):
        source = None
    return {"name": name, "source_sha256": source, "version": version}
