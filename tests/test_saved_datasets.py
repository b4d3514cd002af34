"""What a Hugging Face user keeps: ``save_to_disk`` folders (a ``DatasetDict`` and a single ``Dataset``)
and their ``.arrow`` files pack as the Parquet layout does, with their splits, features and class names;
a ``ClassLabel`` column decodes to its int under ``decode="auto"``; a dataset reads only the fields asked
for, so sources with one extra column mix. Made here with the real ``datasets`` library, offline."""

from __future__ import annotations

import io
from pathlib import Path

import datasets
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from loaders import Mixture, ShardedDataset, ShardedMapDataset, make_loader
from shardpipe.cli import main
from shardpipe.manifest import load_manifest
from tests.datagen import pack_dataset

pytestmark = pytest.mark.timeout(120)
NAMES = ["cat", "dog", "bird"]


def png(i: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), i * 20, dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def saved(tmp_path: Path) -> datasets.Dataset:
    label, text = datasets.ClassLabel(names=NAMES), datasets.Value("string")
    features = datasets.Features({"image": datasets.Image(), "label": label, "text": text})
    rows = {
        "image": [{"bytes": png(i), "path": f"{i}.png"} for i in range(7)],
        "label": [i % 3 for i in range(7)],
        "text": [f"row {i}" for i in range(7)],
    }
    return datasets.Dataset.from_dict(rows, features=features)


def pack(src: Path, out: Path) -> None:
    args = ["pack", str(src), str(out), "--format", "tar", "--order", "sorted", "-q"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output


def test_a_saved_dataset_dict_packs_with_its_splits_features_and_classes(tmp_path: Path) -> None:
    rows = saved(tmp_path)
    datasets.DatasetDict({"train": rows, "test": rows.select([5, 6])}).save_to_disk(str(tmp_path / "dict"))
    pack(tmp_path / "dict", tmp_path / "out")
    manifest = load_manifest(tmp_path / "out")
    assert {name: sum(s.num_samples for s in shards) for name, shards in manifest.splits.items()} == {
        "train": 7,
        "test": 2,
    }
    assert manifest.fields == ("label", "png", "text") and manifest.classes == tuple(NAMES)
    assert manifest.label_fields == ("label",)
    ds = ShardedMapDataset(tmp_path / "out", "train", decode="auto")
    sample = ds[4]  # --order sorted keeps the rows in order: position 4 is row 4
    assert sample["__key__"] == "train/0000000004" and sample["label"] == 4 % 3
    assert sample["text"] == "row 4" and tuple(sample["png"].shape) == (3, 4, 4)


def test_a_dataset_saved_alone_and_its_arrow_file_pack_under_its_split(tmp_path: Path) -> None:
    saved(tmp_path).save_to_disk(str(tmp_path / "one"))
    pack(tmp_path / "one", tmp_path / "out")
    assert list(load_manifest(tmp_path / "out").splits) == ["train"]  # state.json names no split
    datasets.load_from_disk(str(tmp_path / "one")).select(range(3)).save_to_disk(str(tmp_path / "three"))
    arrow = next((tmp_path / "three").glob("*.arrow"))
    pack(arrow, tmp_path / "file")
    assert sum(s.num_samples for s in load_manifest(tmp_path / "file").splits["train"]) == 3


def test_fields_reads_only_those_and_lets_sources_with_an_extra_column_mix(tmp_path: Path) -> None:
    plain = pack_dataset(tmp_path / "a", "tar", 9, max_samples=4, fields=("bin",))
    extra = pack_dataset(tmp_path / "b", "lmdb", 9, max_samples=4, fields=("bin", "txt"))
    with pytest.raises(ValueError, match=r"only in 'b': \['txt'\].*fields=\['bin', 'cls'\]"):
        Mixture({"a": ShardedDataset(plain), "b": ShardedDataset(extra)}, weights={"a": 0.5, "b": 0.5})
    shared = ["bin", "cls"]
    mix = Mixture(
        {"a": ShardedDataset(plain), "b": ShardedDataset(extra, fields=shared)}, weights={"a": 0.5, "b": 0.5}
    )
    batches = list(make_loader(mix, 4, 0))
    assert sum(len(b["__key__"]) for b in batches) == 18
    assert all(sorted(b) == ["__key__", "__pad__", "__source__", "bin", "cls"] for b in batches)
    alone = ShardedDataset(extra, fields=["txt"], shuffle=False)
    whole = ShardedDataset(extra, shuffle=False)
    assert [(s["__key__"], s["txt"]) for s in alone] == [(s["__key__"], s["txt"]) for s in whole]
    assert all("bin" not in s for s in alone)
    with pytest.raises(ValueError, match=r"fields names \['jpg'\].*its fields are bin, cls, txt"):
        ShardedDataset(extra, fields=["jpg"])
