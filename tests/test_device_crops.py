"""Crops finished on a device (``device="cpu"`` here: the same code as on a GPU, through nvImageCodec's CPU
backend): the workers ship bytes and draws, the loader decodes in the trainer process; the batches equal
the worker-side crops', every loader guarantee holds, and undecodable images are named or skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from loaders import CenterCrop, RandomResizedCrop, ShardedDataset, make_loader
from loaders.batches import RaggedBytes, collate_samples
from loaders.images import device_crops
from loaders.reading.decode import DecodeContext, DecodeError
from shardpipe import PackOptions, pack
from testkit.photos import make_photos, truncated
from tests.test_image_crops import photos_pack, psnr

__all__ = ["photos_pack"]  # the fixture, shared with tests/test_image_crops.py


def loader(pack_dir: Path, crop: Any, num_workers: int, collate_fn: Any = None, **kwargs: Any) -> Any:
    dataset = ShardedDataset(
        pack_dir, rank=0, world_size=1, seed=2, decode={"jpg": crop, "cls": "cls"}, **kwargs
    )
    extra = {} if collate_fn is None else {"collate_fn": collate_fn}
    return make_loader(dataset, 8, num_workers, persistent_workers=False, **extra)


@pytest.mark.parametrize(
    ("num_workers", "collate_fn"), [(0, None), (2, None), (0, collate_samples)], ids=["0", "2", "per-sample"]
)
@pytest.mark.parametrize("make", [RandomResizedCrop, CenterCrop], ids=["train", "eval"])
def test_device_crops_are_the_worker_crops(
    photos_pack: Path, make: Any, num_workers: int, collate_fn: Any
) -> None:
    on_workers = list(loader(photos_pack, make(48), num_workers))
    on_device = list(loader(photos_pack, make(48, device="cpu"), num_workers, collate_fn))
    assert len(on_workers) == len(on_device)
    for a, b in zip(on_workers, on_device, strict=True):
        assert a["__key__"] == b["__key__"] and torch.equal(a["cls"], b["cls"])
        assert b["jpg"].shape == a["jpg"].shape and b["jpg"].dtype == torch.uint8
        for x, y in zip(a["jpg"], b["jpg"], strict=True):  # same boxes and flips, decoded elsewhere
            assert psnr(x.numpy(), y.numpy()) >= 30


def test_the_workers_ship_bytes_and_draws_not_pixels() -> None:
    photo = make_photos_bytes()
    crop = RandomResizedCrop(64, device="cpu")
    shipped = crop(RaggedBytes.from_list([photo]), ["a/1"], DecodeContext(seed=5))
    assert isinstance(shipped, RaggedBytes) and shipped[0][device_crops.HEADER_BYTES :] == photo
    assert crop.output_bytes == device_crops.HEADER_BYTES
    finished = crop.finish(shipped, DecodeContext())
    worker_side = RandomResizedCrop(64)(RaggedBytes.from_list([photo]), ["a/1"], DecodeContext(seed=5))
    assert psnr(finished[0].numpy(), worker_side[0].numpy()) >= 30


def make_photos_bytes() -> bytes:
    from testkit.photos import photo_bytes

    return photo_bytes(1, size=(320, 240), seed=8)[0]


def test_a_truncated_image_fails_in_the_trainer_named_or_skipped(tmp_path: Path) -> None:
    make_photos(tmp_path / "src", 10, size=(160, 120), num_classes=2, seed=9)
    broken = sorted((tmp_path / "src").rglob("*.jpg"))[3]
    broken.write_bytes(truncated(broken.read_bytes()))
    pack(tmp_path / "src", tmp_path / "tar", PackOptions(format="tar", labels="dirname"), quiet=True)
    key = broken.relative_to(tmp_path / "src").with_suffix("").as_posix()
    with pytest.raises(DecodeError, match=f"field 'jpg' of sample '{key}' \\(in the trainer process\\)"):
        list(loader(tmp_path / "tar", RandomResizedCrop(32, device="cpu"), 0))
    skipping = loader(tmp_path / "tar", RandomResizedCrop(32, device="cpu"), 0, on_error="skip")
    batches = list(skipping)
    flagged = [k for b in batches for k, pad in zip(b["__key__"], b["__pad__"].tolist(), strict=True) if pad]
    assert flagged == [key] and skipping.sharded.num_errors == 1
    black = [b["jpg"][i] for b in batches for i, k in enumerate(b["__key__"]) if k == key]
    assert int(black[0].sum()) == 0


def test_a_device_must_be_cpu_or_cuda() -> None:
    with pytest.raises(ValueError, match="device must be"):
        RandomResizedCrop(32, device="meta")
