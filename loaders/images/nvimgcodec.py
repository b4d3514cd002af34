"""nvImageCodec, the optional decoder behind the crops' region route and the device crops.

It is an extra (``pip install 'shardpipe[nvimgcodec]'``, libjpeg-turbo inside, no GPU needed): without it
:func:`available` is False and the crops keep Pillow's routes. The module is imported on first use with
its standard error captured, because on a machine without CUDA's codec libraries it prints a line per
missing GPU library that a CPU user cannot act on; the text is kept in :data:`import_messages` and logged
when a device decoder is asked for. A decoder owns threads, so each process makes its own (a forked
DataLoader worker never uses its parent's). Decoding never applies the EXIF orientation: the crops map
their box onto the stored pixels and turn the result themselves, whichever decoder ran.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

log = logging.getLogger("loaders")
import_messages = ""
"""What importing nvImageCodec printed (its missing GPU libraries), for the device route's diagnostics."""

_state: dict[Any, Any] = {}  # "module" (or "error"); decoders by (pid, device)
Region = tuple[int, int, int, int]
"""``(top, left, bottom, right)`` in whole stored pixels."""
GROUP_PIXELS = 1 << 24
"""Pixels of regions decoded in one call: a batch of large photos' regions is decoded in groups, so a
worker (or the device) never holds every decoded region of a batch at once."""


def module() -> Any | None:
    """``nvidia.nvimgcodec``, imported once per process; None when it is not installed or cannot load."""
    if "module" not in _state:
        _state["module"] = _quiet_import()
    return _state["module"]


def available() -> bool:
    """Whether nvImageCodec is installed and loads here."""
    return module() is not None


def require() -> Any:
    """The module, or an ImportError saying how to install it."""
    found = module()
    if found is None:
        raise ImportError(
            "decoding crops on a device needs nvImageCodec: pip install 'shardpipe[nvimgcodec]' "
            f"({_state.get('error', 'not installed')})"
        )
    return found


def _quiet_import() -> Any | None:
    global import_messages
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")  # its own errors: ours name the sample instead
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            from nvidia import nvimgcodec
        except (ImportError, OSError) as exc:
            _state["error"] = f"{type(exc).__name__}: {exc}"
            return None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            import_messages = captured.read().decode(errors="replace").strip()
    return nvimgcodec


def decoder(device: torch.device) -> Any:
    """This process's decoder for ``device``: the CPU backend (libjpeg-turbo) on ``cpu``, every backend
    of the GPU (nvJPEG, the hardware JPEG engine, CPU fallbacks) on ``cuda:N``."""
    nv = require()
    key = (os.getpid(), str(device))
    found = _state.get(key)
    if found is None:
        if device.type == "cpu":
            threads = 1 if torch.utils.data.get_worker_info() is not None else torch.get_num_threads()
            found = nv.Decoder(
                device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
                max_num_cpu_threads=threads,
                backends=[nv.Backend(nv.BackendKind.CPU_ONLY)],
            )
        else:
            if import_messages:
                log.info("nvImageCodec said on import: %s", import_messages)
            index = device.index if device.index is not None else torch.cuda.current_device()
            found = nv.Decoder(device_id=index)
        _state[key] = found
    return found


def groups(regions: Sequence[Region], budget: int | None = None) -> Iterator[list[int]]:
    """Positions of ``regions`` in runs whose pixels add up to at most ``budget`` (default
    :data:`GROUP_PIXELS`), or one region alone when it is larger."""
    budget = GROUP_PIXELS if budget is None else budget
    group: list[int] = []
    pixels = 0
    for index, (top, left, bottom, right) in enumerate(regions):
        area = (bottom - top) * (right - left)
        if group and pixels + area > budget:
            yield group
            group, pixels = [], 0
        group.append(index)
        pixels += area
    if group:
        yield group


def decode_regions(
    datas: Sequence[bytes | memoryview], regions: Sequence[Region | None], device: torch.device
) -> list[Any]:
    """Each image's region (None: the whole image) decoded as RGB in one batched call: per image an
    nvImageCodec ``Image`` (:func:`as_tensor` reads it), or None where it could
    not be parsed or decoded."""
    nv = require()
    streams: list[Any] = []
    places: list[int] = []
    for index, (data, region) in enumerate(zip(datas, regions, strict=True)):
        try:
            stream = nv.CodeStream(data)
            if region is not None:
                top, left, bottom, right = region
                stream = stream.get_sub_code_stream(region=nv.Region(top, left, bottom, right))
        except RuntimeError:  # not an image it can parse: the caller's fallback decides
            continue
        streams.append(stream)
        places.append(index)
    found: list[Any] = [None] * len(datas)
    if streams:
        params = nv.DecodeParams(
            apply_exif_orientation=False, color_spec=nv.ColorSpec.SRGB, sample_format=nv.SampleFormat.I_RGB
        )
        stream_id = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        decoded = decoder(device).decode(streams, params=params, cuda_stream=stream_id)
        for index, image in zip(places, decoded, strict=True):
            found[index] = image
    return found


def as_tensor(image: Any, device: torch.device) -> torch.Tensor:
    """A decoded image as ``(h, w, 3)`` uint8 on ``device``, sharing its buffer (which it keeps alive)."""
    if device.type == "cpu":
        return torch.from_numpy(np.asarray(image))
    from torch.utils.dlpack import from_dlpack

    return from_dlpack(image)
