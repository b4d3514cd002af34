"""The fused image crops: torchvision's crop distribution, drawn before decoding; close to a full-size
decode; every image kind; reproducible by (seed, epoch, key); every loader guarantee on this path."""

from __future__ import annotations

import io
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from scipy.stats import ks_2samp

from loaders import CenterCrop, RandomResizedCrop, ShardedDataset, make_loader
from loaders.batches import RaggedBytes, collate_samples
from loaders.images.crops import crop_draws as draws
from loaders.images.crops import resized_crop_box
from loaders.reading.decode import DecodeContext, DecodeError
from shardpipe import PackOptions, pack
from testkit.photos import as_cmyk, as_grey, as_png, as_webp, exif_rotated, make_photos, photo_bytes

PHOTOS = photo_bytes(24, size=(500, 375), seed=11)
LARGE = photo_bytes(4, size=(2000, 1500), seed=12)


def torchvision_box(width: int, height: int, generator: torch.Generator) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params, written out from its documented algorithm with torch's
    own random numbers (torchvision does not install beside this torch): the reference distribution."""
    area, (r0, r1) = width * height, (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * torch.empty(1).uniform_(0.08, 1.0, generator=generator).item()
        aspect = math.exp(torch.empty(1).uniform_(r0, r1, generator=generator).item())
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator).item())
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator).item())
            return left, top, w, h
    ratio = width / height
    w, h = (
        (width, round(width / (3 / 4)))
        if ratio < 3 / 4
        else (round(height * 4 / 3), height)
        if ratio > 4 / 3
        else (width, height)
    )
    return (width - w) // 2, (height - h) // 2, w, h


@pytest.mark.parametrize("size", [(500, 375), (2000, 1500), (300, 900)])
def test_crop_boxes_follow_torchvisions_distribution(size: tuple[int, int]) -> None:
    rng, generator = np.random.default_rng(0), torch.Generator().manual_seed(0)
    ours = [resized_crop_box(*size, rng, (0.08, 1.0), (3 / 4, 4 / 3)) for _ in range(4000)]
    theirs = [torchvision_box(*size, generator) for _ in range(4000)]
    for measure in (lambda b: b[2] * b[3], lambda b: math.log(b[2] / b[3]), lambda b: b[0], lambda b: b[1]):
        result = ks_2samp([measure(b) for b in ours], [measure(b) for b in theirs])
        assert result.pvalue > 0.001, result


def decoded(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return ImageOps.exif_transpose(image).convert("RGB")


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    error = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if error == 0 else 10 * math.log10(255**2 / error)


def crops(decoder: Any, images: list[bytes], keys: list[str], epoch: int = 0) -> torch.Tensor:
    return decoder(RaggedBytes.from_list(images), keys, DecodeContext(seed=3, epoch=epoch))


@pytest.mark.parametrize("decoder", [RandomResizedCrop(224), CenterCrop(224)], ids=["train", "eval"])
def test_fused_crops_are_within_30_db_of_a_full_size_decode(decoder: Any) -> None:
    """The reference: the whole image decoded, the same box cut, the same antialiased resize."""
    images = PHOTOS + LARGE
    keys = [f"k/{i}" for i in range(len(images))]
    got = crops(decoder, images, keys)
    assert got.shape == (len(images), 3, 224, 224) and got.dtype == torch.uint8
    for i, data in enumerate(images):
        image = decoded(data)
        box, flip = decoder.box(*image.size, draws(3, 0, keys[i]))  # the decoder's own draws
        reference = image.resize((224, 224), Image.Resampling.BILINEAR, box=box)
        if flip:
            reference = reference.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        assert psnr(got[i].permute(1, 2, 0).numpy(), np.asarray(reference)) >= 30, i


def test_draws_depend_on_seed_epoch_and_key_only() -> None:
    keys = [f"k/{i}" for i in range(len(PHOTOS))]
    first = crops(RandomResizedCrop(96), PHOTOS, keys)
    assert torch.equal(first, crops(RandomResizedCrop(96), PHOTOS, keys))
    assert torch.equal(first[5:], crops(RandomResizedCrop(96), PHOTOS[5:], keys[5:]))  # not the position
    assert not torch.equal(first, crops(RandomResizedCrop(96), PHOTOS, keys, epoch=1))
    assert torch.equal(crops(CenterCrop(96), PHOTOS, keys), crops(CenterCrop(96), PHOTOS, keys, epoch=1))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(orientation: int) -> None:
    """A rotated file's crop equals the crop of the same picture stored upright (the box is drawn on the
    image as displayed)."""
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(exif_rotated(PHOTOS[0], orientation))))
    buffer = io.BytesIO()
    upright.save(buffer, "PNG")
    for decoder in (RandomResizedCrop(128), CenterCrop(128)):
        a = crops(decoder, [exif_rotated(PHOTOS[0], orientation)], ["x/1"])[0]
        b = crops(decoder, [buffer.getvalue()], ["x/1"])[0]
        assert psnr(a.numpy(), b.numpy()) > 30, (orientation, decoder)


@pytest.mark.parametrize("make", [as_png, as_webp, as_grey, as_cmyk], ids=["png", "webp", "grey", "cmyk"])
def test_every_image_kind_decodes_to_rgb(make: Any) -> None:
    data = make(PHOTOS[1])
    got = crops(CenterCrop(64), [data], ["x/1"])[0].permute(1, 2, 0).numpy()
    image = decoded(data)
    box, _ = CenterCrop(64).box(*image.size, np.random.default_rng(0))
    assert psnr(got, np.asarray(image.resize((64, 64), Image.Resampling.BILINEAR, box=box))) > 30


def test_an_undecodable_image_is_named_or_skipped() -> None:
    column = RaggedBytes.from_list([PHOTOS[0], b"not an image", PHOTOS[1]])
    with pytest.raises(DecodeError) as caught:
        RandomResizedCrop(32)(column, ["a/0", "a/1", "a/2"], DecodeContext())
    assert caught.value.index == 1 and "UnidentifiedImageError" in str(caught.value)
    context = DecodeContext(skip=True)
    out = RandomResizedCrop(32)(column, ["a/0", "a/1", "a/2"], context)
    assert [i for i, _ in context.failed] == [1] and int(out[1].sum()) == 0 and int(out[0].sum()) > 0


@pytest.fixture(scope="module")
def photos_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    make_photos(root / "src", 60, size=(200, 150), num_classes=3, seed=5)
    pack(root / "src", root / "tar", PackOptions(format="tar", labels="dirname", max_samples=13), quiet=True)
    return root / "tar"


def as_lists(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, list) else v.tolist() for k, v in batch.items()}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_fused_path_equals_the_per_sample_path_and_resumes_exactly(
    photos_pack: Path, num_workers: int
) -> None:
    decode = {"jpg": RandomResizedCrop(48), "cls": "cls"}

    def loader(**kwargs: Any) -> Any:
        dataset = ShardedDataset(photos_pack, rank=0, world_size=1, seed=2, shuffle_buffer=9, decode=decode)
        return make_loader(dataset, 8, num_workers, persistent_workers=False, **kwargs)

    fused = loader()
    assert fused.sharded.batched
    expected = [as_lists(b) for b in fused]
    assert expected == [as_lists(b) for b in loader(collate_fn=collate_samples)]
    run = loader()
    iterator = iter(run)
    consumed = [as_lists(next(iterator)) for _ in range(3)]
    state = run.state_dict()
    del iterator
    resumed = loader()
    resumed.load_state_dict(state)
    assert consumed + [as_lists(b) for b in resumed] == expected  # the resumed epoch's crops are its own


def test_ranks_step_equally_and_see_every_image_once(photos_pack: Path) -> None:
    seen: Counter[str] = Counter()
    steps = []
    for rank in range(3):
        dataset = ShardedDataset(photos_pack, rank=rank, world_size=3, seed=1, decode={"jpg": CenterCrop(32)})
        batches = list(make_loader(dataset, 7, 0))
        steps.append(len(batches))
        for batch in batches:
            assert batch["jpg"].shape[1:] == (3, 32, 32)
            seen.update(
                k for k, pad in zip(batch["__key__"], batch["__pad__"].tolist(), strict=True) if not pad
            )
    assert len(set(steps)) == 1 and len(seen) == 60 and set(seen.values()) == {1}


def test_a_damaged_image_in_a_pack_is_named_with_its_shard_or_skipped(tmp_path: Path) -> None:
    make_photos(tmp_path / "src", 12, size=(120, 90), num_classes=2, seed=6)
    broken = sorted((tmp_path / "src").rglob("*.jpg"))[4]
    broken.write_bytes(b"\xff\xd8 truncated")
    pack(tmp_path / "src", tmp_path / "tar", PackOptions(format="tar", labels="dirname"), quiet=True)
    key = broken.relative_to(tmp_path / "src").with_suffix("").as_posix()
    for collate in (None, collate_samples):
        dataset = ShardedDataset(tmp_path / "tar", rank=0, world_size=1, decode={"jpg": CenterCrop(16)})
        with pytest.raises(
            DecodeError, match=f"field 'jpg' of sample '{key}' \\(shard train/shard-000000.tar\\)"
        ):
            list(make_loader(dataset, 4, 0, collate_fn=collate))
        skipping = ShardedDataset(tmp_path / "tar", rank=0, world_size=1, decode={"jpg": CenterCrop(16)},
                                  on_error="skip")  # fmt: skip
        batches = list(make_loader(skipping, 4, 0, collate_fn=collate))
        flagged = [
            k for b in batches for k, pad in zip(b["__key__"], b["__pad__"].tolist(), strict=True) if pad
        ]
        assert flagged == [key] and skipping.num_errors == 1
