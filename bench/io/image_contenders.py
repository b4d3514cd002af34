"""The image profiles' loaders: the training input of an ImageNet-style run, built fresh per run.

Every contender yields dicts with the crops as one uint8 tensor ``(B, 3, 224, 224)`` under the image
field and the labels as one int64 tensor under ``cls``, so the consumer costs the same for all:

- ``imagefolder-pil``: what a torchvision user writes: a map-style Dataset over the files, Pillow open and
  ``convert("RGB")`` (``ImageFolder``'s loader), ``RandomResizedCrop(224)`` and a horizontal flip, to a
  uint8 tensor, default collate. torchvision does not install beside the pinned torch here, so
  :func:`train_crop` is its algorithm written with Pillow, as torchvision runs it on a Pillow image:
  ``get_params`` with torch's generator (scale (0.08, 1), ratio (3/4, 4/3), ten tries, then a centre crop),
  ``crop`` then ``resize((224, 224), BILINEAR)`` (Pillow's resize is antialiased), flip if
  ``torch.rand(1) < 0.5``, ``PILToTensor``;
- ``webdataset-pil``: webdataset over shardpipe's tar pack of the same photos, ``.decode("rgb8")`` (the
  full image decoded to an array), then the same crop on the array, as webdataset users do;
- ``shardpipe-pil``: shardpipe's per-sample path: a ``transform`` that Pillow-decodes the bytes and
  applies the same crop;
- ``shardpipe-fused``: ``decode={"jpg": RandomResizedCrop(224), "cls": "cls"}``, the crop drawn before
  decoding (``loaders.images.crops``), on ``make_loader``'s batch path;
- ``shardpipe-fused-<PREPARED_MAX_SIDE>``: the same on the pack prepared with ``--image-max-side``
  ``PREPARED_MAX_SIDE`` (``bench.io.image_data``);
- ``shardpipe-fused-device`` (``--device``): ``RandomResizedCrop(224, device=...)``: the workers ship the
  bytes and the draws, the trainer process decodes and crops each batch on the device
  (``loaders.images.device_crops``); :class:`TimedDeviceCrop` records that time.

``decode-limit`` (:mod:`bench.io.decode_limit`) is the fused crop alone, no loader: the ceiling of the last
two. All shuffle as their users would; all take the same DataLoader settings.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate

from bench.io.contenders import SEED, SHUFFLE_BUFFER, LoaderSettings, shardpipe_loader
from bench.io.image_data import PREPARED_MAX_SIDE
from loaders import RandomResizedCrop, ShardedDataset

CROP = 224
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)  # torchvision's RandomResizedCrop defaults
FUSED_PREPARED = f"shardpipe-fused-{PREPARED_MAX_SIDE}"
FUSED_DEVICE = "shardpipe-fused-device"
LOADERS = ("imagefolder-pil", "webdataset-pil", "shardpipe-pil", "shardpipe-fused", FUSED_PREPARED)
LIMIT = "decode-limit"
LIMIT_256 = f"{LIMIT}-{PREPARED_MAX_SIDE}"
IMAGE_NAMES = (*LOADERS, LIMIT)
DATA_NAMES = ("shardpipe-pil", "shardpipe-fused", LIMIT, LIMIT_256)
"""``--data``: what runs on a pack of the user's (no file tree, no prepared pack: :data:`LIMIT_256` is
the decode limit on its photos shrunk in memory as ``--image-max-side PREPARED_MAX_SIDE`` would)."""


@dataclass(frozen=True, slots=True)
class ImageSource:
    """What the contenders read: the photos as files, shardpipe's pack of them, the prepared pack."""

    pack: Path
    field: str = "jpg"
    label: str | None = "cls"  # None: the pack has no labels; the batches then carry none
    tree: Path | None = None
    prepared: Path | None = None
    shards: tuple[Path, ...] = ()  # the pack's tar shards, for webdataset
    device: str | None = None  # --device: where shardpipe-fused-device finishes its crops


FINISH_SECONDS: list[float] = []
"""Seconds each batch's crops took in the trainer process (``shardpipe-fused-device``), this process's."""


@dataclass(frozen=True)
class TimedDeviceCrop(RandomResizedCrop):
    """``RandomResizedCrop`` on a device, timing its trainer-side step to the end of its device work."""

    def finish(self, value: Any, context: Any) -> torch.Tensor:
        start = time.perf_counter()
        out = super().finish(value, context)
        if out.is_cuda:
            torch.cuda.synchronize(out.device)
        FINISH_SECONDS.append(time.perf_counter() - start)
        return out


def crop_box(width: int, height: int) -> tuple[int, int, int, int]:
    """``(top, left, h, w)``: torchvision's ``RandomResizedCrop.get_params``, on torch's generator."""
    area = height * width
    log_ratio = torch.log(torch.tensor(RATIO)).tolist()
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(SCALE[0], SCALE[1]).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
        w = round(math.sqrt(target_area * aspect_ratio))
        h = round(math.sqrt(target_area / aspect_ratio))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,)).item())
            left = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(RATIO):
        w, h = width, round(width / min(RATIO))
    elif in_ratio > max(RATIO):
        w, h = round(height * max(RATIO)), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def train_crop(image: Any) -> torch.Tensor:
    """torchvision's ``RandomResizedCrop(224)``, ``RandomHorizontalFlip()`` and ``PILToTensor()`` on a
    Pillow image: ``(3, 224, 224)`` uint8."""
    from PIL import Image

    top, left, h, w = crop_box(*image.size)
    image = image.crop((left, top, left + w, top + h)).resize((CROP, CROP), Image.Resampling.BILINEAR)
    if torch.rand(1) < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.as_tensor(np.array(image, copy=True)).view(CROP, CROP, 3).permute(2, 0, 1)


def open_rgb(data: bytes | Path) -> Any:
    """Pillow open and convert to RGB, as torchvision's ``ImageFolder`` loader does."""
    from PIL import Image

    if isinstance(data, Path):
        with open(data, "rb") as f:
            return Image.open(f).convert("RGB")
    return Image.open(io.BytesIO(data)).convert("RGB")


def array_crop(array: np.ndarray) -> torch.Tensor:
    """The same crop on a decoded ``(H, W, 3)`` array (webdataset's ``rgb8``): the box cut out of the
    array, then resized and flipped with Pillow as :func:`train_crop` does."""
    from PIL import Image

    top, left, h, w = crop_box(array.shape[1], array.shape[0])
    image = Image.fromarray(np.ascontiguousarray(array[top : top + h, left : left + w]))
    image = image.resize((CROP, CROP), Image.Resampling.BILINEAR)
    if torch.rand(1) < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.as_tensor(np.array(image, copy=True)).view(CROP, CROP, 3).permute(2, 0, 1)


class ImageFolderDataset(Dataset[dict[str, Any]]):
    """``ImageFolder`` + the train transforms: one file per sample, its class from its folder's index."""

    def __init__(self, tree: Path) -> None:
        classes = sorted(p.name for p in tree.iterdir() if p.is_dir())
        index = {name: i for i, name in enumerate(classes)}
        self.items = [(path, index[path.parent.name]) for path in sorted(tree.rglob("*.jpg"))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        path, label = self.items[i]
        return {"jpg": train_crop(open_rgb(path)), "cls": label}


@dataclass(frozen=True, slots=True)
class PillowTransform:
    """shardpipe's per-sample path: the image field's bytes Pillow-decoded and cropped (``cls`` arrives
    decoded by ``decode={"cls": "cls"}``)."""

    field: str
    label: str | None

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        out = {self.field: train_crop(open_rgb(sample[self.field]))}
        if self.label is not None:
            out[self.label] = sample[self.label]
        return out


@dataclass(frozen=True, slots=True)
class ArrayTransform:
    """webdataset's sample after ``.decode("rgb8")``: the array cropped, the label as decoded."""

    field: str

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return {self.field: array_crop(sample[self.field]), "cls": sample["cls"]}


def _imagefolder(source: ImageSource, s: LoaderSettings) -> Iterable[Any]:
    if source.tree is None:
        raise ValueError("imagefolder-pil reads the photos as files: this source has no file tree")
    dataset = ImageFolderDataset(source.tree)
    sampler: DistributedSampler[dict[str, Any]] = DistributedSampler(
        dataset, num_replicas=1, rank=0, shuffle=True, seed=SEED
    )
    kwargs = {**s.dataloader_kwargs(), "collate_fn": default_collate}
    return DataLoader(dataset, batch_size=s.batch_size, sampler=sampler, **kwargs)


def _webdataset(source: ImageSource, s: LoaderSettings) -> Iterable[Any]:
    import webdataset as wds

    urls = [str(p) for p in source.shards]
    pipeline = (
        wds.WebDataset(urls, shardshuffle=len(urls), seed=SEED, empty_check=False)
        .shuffle(SHUFFLE_BUFFER)  # of the encoded samples: a buffer of decoded photos would not fit
        .decode("rgb8")
        .map(ArrayTransform(source.field))
        .batched(s.batch_size, collation_fn=default_collate, partial=True)
    )
    kwargs = s.dataloader_kwargs()
    kwargs.pop("collate_fn")  # batched() already collated
    loader: Iterable[Any] = wds.WebLoader(pipeline, batch_size=None, **kwargs)
    return loader


def _sharded(
    source: ImageSource, s: LoaderSettings, pack: Path, *, fused: bool, device: str | None = None
) -> Iterable[Any]:
    labels: dict[str, Any] = {} if source.label is None else {source.label: "cls"}
    crop = RandomResizedCrop(CROP) if device is None else TimedDeviceCrop(CROP, device=device)
    decode = {source.field: crop, **labels} if fused else labels
    transform = None if fused else PillowTransform(source.field, source.label)
    dataset = ShardedDataset(
        pack, shuffle=True, seed=SEED, shuffle_buffer=SHUFFLE_BUFFER, decode=decode, transform=transform
    )
    return shardpipe_loader(dataset, s)


def _prepared(source: ImageSource, s: LoaderSettings) -> Iterable[Any]:
    if source.prepared is None:
        raise ValueError(f"{FUSED_PREPARED} reads the prepared pack: this source has none")
    return _sharded(source, s, source.prepared, fused=True)


BUILDERS: dict[str, Callable[[ImageSource, LoaderSettings], Iterable[Any]]] = {
    "imagefolder-pil": _imagefolder,
    "webdataset-pil": _webdataset,
    "shardpipe-pil": lambda source, s: _sharded(source, s, source.pack, fused=False),
    "shardpipe-fused": lambda source, s: _sharded(source, s, source.pack, fused=True),
    FUSED_PREPARED: _prepared,
    FUSED_DEVICE: lambda source, s: _sharded(source, s, source.pack, fused=True, device=source.device),
}


def is_limit(name: str) -> bool:
    """Whether ``name`` is a decode limit (no loader: :mod:`bench.io.decode_limit`)."""
    return name in (LIMIT, LIMIT_256)


def build_image(name: str, source: ImageSource, settings: LoaderSettings) -> Iterable[Any]:
    """A fresh loader for image contender ``name`` (workers start at its first ``iter()``)."""
    return BUILDERS[name](source, settings)
