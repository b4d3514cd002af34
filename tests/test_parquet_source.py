"""Parquet datasets as a source: Hugging Face's layout (no key column, {bytes, path} images, ClassLabel
features in the schema metadata), read in pieces, packed with the guarantees of any source."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from shardpipe.cli import main
from shardpipe.errors import DataError, UsageError
from shardpipe.formats import get_format
from shardpipe.formats.layout import ShardIndex
from shardpipe.manifest import load_manifest
from shardpipe.packing import PackOptions, output, pack
from shardpipe.packing.mapping import MapError
from shardpipe.sources import IncompleteSamplesError, parquet_table, scan_source
from shardpipe.sources.parquet_cells import blob_name
from shardpipe.sources.parquet_columns import UnusableColumnError
from shardpipe.sources.parquet_layout import ordered_splits, split_of
from shardpipe.storage import Store, open_store
from shardpipe.tools.inspection import inspect, render
from testkit.servers import S3Server

pytestmark = pytest.mark.timeout(120)

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
FEATURES = {  # as datasets writes them into the schema metadata (key b"huggingface")
    "image": {"_type": "Image"},
    "label": {"names": ["cat", "dog", "bird"], "_type": "ClassLabel"},
    "text": {"dtype": "string", "_type": "Value"},
    "ids": {"feature": {"dtype": "int32", "_type": "Value"}, "_type": "Sequence"},
    "emb": {"feature": {"dtype": "float16", "_type": "Value"}, "_type": "Sequence"},
}
PNG = b"\x89PNG\r\n\x1a\n"


def hf_table(start: int, count: int, *, features: dict[str, object] | None = FEATURES) -> pa.Table:
    """Rows ``start..start+count`` in the shape of a hub dataset; row ``i`` is recognisable from its cells."""
    rows = range(start, start + count)
    table = pa.table(
        {
            "image": pa.array([{"bytes": PNG + b"%d" % i, "path": f"photo_{i}.PNG"} for i in rows], IMAGE),
            "label": pa.array([i % 3 for i in rows], pa.int64()),
            "text": [f"caption {i} é" for i in rows],
            "ids": pa.array([list(range(i % 4)) for i in rows], pa.list_(pa.int32())),
            "emb": pa.array([[i / 2, -1.0] for i in rows], pa.list_(pa.float16())),
        }
    )
    if features is None:
        return table
    return table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})


def hub_folder(root: Path, train: tuple[int, ...] = (30, 25), test: int = 10) -> Path:
    """A downloaded hub dataset: a card, git's attributes, data/{split}-NNNNN-of-NNNNN.parquet."""
    (root / "data").mkdir(parents=True)
    start = 0
    for number, count in enumerate(train):
        path = root / "data" / f"train-{number:05d}-of-{len(train):05d}.parquet"
        pq.write_table(hf_table(start, count), path, row_group_size=7)
        start += count
    pq.write_table(hf_table(1000, test), root / "data" / "test-00000-of-00001.parquet", row_group_size=4)
    (root / "README.md").write_text("---\nlicense: mit\n---\n# A dataset\n")
    (root / ".gitattributes").write_text("*.parquet filter=lfs\n")
    return root


def read_samples(root: Path) -> dict[str, dict[str, bytes]]:
    """Every sample of a packed dataset, by key."""
    manifest = load_manifest(root)
    found: dict[str, dict[str, bytes]] = {}
    for shards in manifest.splits.values():
        for shard in shards:
            index = None
            if shard.index_path is not None:
                index = ShardIndex.read(root / shard.index_path, shard.num_samples, manifest.fields)
            for key, fields in get_format(manifest.format).read(
                root / shard.path, 0, shard.num_samples, index
            ):
                found[key] = {name: bytes(value) for name, value in fields.items()}
    return found


def files_of(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def test_split_names_come_from_file_names_and_folders() -> None:
    assert split_of("data/train-00000-of-00004.parquet") == "train"
    assert split_of("data/train_sft-00001-of-00002.parquet") == "train_sft"  # push_to_hub: as written
    assert split_of("validation-0.parquet") == "validation"
    assert split_of("dev.parquet") == "validation"  # a keyword, named as datasets names it
    assert split_of("mnist/test.parquet") == "test"
    assert split_of("default/partial-train/0000.parquet") == "partial-train"  # the hub's conversion
    assert split_of("train/part-00000.snappy.parquet") == "train"  # a folder per split
    assert split_of("hf.parquet") == split_of("data/part-0.parquet") == "train"
    assert split_of("value.parquet") == "train"  # a word that merely starts like one
    assert ordered_splits(["test", "extra", "train", "validation", "aux"]) == [
        "train", "validation", "test", "aux", "extra",
    ]  # fmt: skip


def test_a_hub_folder_packs_with_its_splits_keys_fields_and_class_names(tmp_path: Path) -> None:
    src = hub_folder(tmp_path / "hub")
    out = tmp_path / "out"
    result = pack(src, out, PackOptions(format="tar", field_map={"label": "cls"}), quiet=True)
    manifest = result.manifest
    assert list(manifest.splits) == ["train", "test"]
    assert [sum(s.num_samples for s in shards) for shards in manifest.splits.values()] == [55, 10]
    assert manifest.fields == ("cls", "emb.npy", "ids.npy", "png", "text")
    assert manifest.classes == ("cat", "dog", "bird")
    assert manifest.source["features"] == FEATURES
    assert manifest.source["fields"] == {
        "image": "png", "label": "cls", "text": "text", "ids": "ids.npy", "emb": "emb.npy",
    }  # fmt: skip
    assert manifest.split_rule["splits"] == ["train", "test"] and manifest.job["options"]["split"] == "source"
    samples = read_samples(out)
    assert len(samples) == 65
    first_of_second_file = samples["train/0000000030"]  # positions run on across a split's files
    assert first_of_second_file["png"] == PNG + b"30" and first_of_second_file["cls"] == b"0"
    assert first_of_second_file["text"] == "caption 30 é".encode()
    ids = npy(samples["train/0000000031"]["ids.npy"])
    assert ids.dtype == np.int32 and ids.tolist() == [0, 1, 2]
    emb = npy(samples["test/0000000003"]["emb.npy"])
    assert emb.dtype == np.float16 and emb.tolist() == [501.5, -1.0]  # test row 3 is row 1003
    assert npy(samples["train/0000000000"]["ids.npy"]).shape == (0,)
    shown = render(inspect(out))
    assert "classes: cat, dog, bird" in shown


def test_workers_and_pieces_give_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = hub_folder(tmp_path / "hub")
    options = PackOptions(format="tfrecord", max_samples=9, field_map={"label": "cls", "emb": ""})
    pack(src, tmp_path / "one", replace(options, workers=1), quiet=True)
    monkeypatch.setattr(parquet_table, "PIECE_BYTES", 1)  # a piece per row group, read on two workers
    pack(src, tmp_path / "two", replace(options, workers=2), quiet=True)
    assert files_of(tmp_path / "two") == files_of(tmp_path / "one")
    assert "emb.npy" not in load_manifest(tmp_path / "one").fields  # an empty name leaves a column out


def test_an_interrupted_pack_resumes_to_the_same_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = hub_folder(tmp_path / "hub")
    options = PackOptions(format="lmdb", max_samples=10, workers=1)
    pack(src, tmp_path / "reference", options, quiet=True)

    def killed(store: Store, manifest: object) -> None:
        raise KeyboardInterrupt("killed before the manifest")

    monkeypatch.setattr(output, "write_manifest", killed)
    with pytest.raises(KeyboardInterrupt):
        pack(src, tmp_path / "out", options, quiet=True)
    monkeypatch.undo()
    (tmp_path / "out" / "train" / "shard-000002.lmdb").unlink()
    resumed = pack(src, tmp_path / "out", replace(options, resume=True), quiet=True)
    assert (resumed.num_written, resumed.num_reused) == (1, 6)
    assert files_of(tmp_path / "out") == files_of(tmp_path / "reference")


def test_a_map_runs_on_rows_and_its_errors_name_the_file_and_row(tmp_path: Path) -> None:
    src = hub_folder(tmp_path / "hub")
    mapped = pack(src, tmp_path / "mapped", PackOptions(format="tar", map="tests.maps:unchanged"), quiet=True)
    plain = pack(src, tmp_path / "plain", PackOptions(format="tar"), quiet=True)
    assert [s.sha256 for s in mapped.manifest.splits["train"]] == [
        s.sha256 for s in plain.manifest.splits["train"]
    ]
    failing = PackOptions(format="tar", map="tests.test_parquet_source:fail_on_row_37")
    with pytest.raises(
        MapError, match=r"sample 'train/0000000037' \(.*train-00001-of-00002\.parquet row 8\)"
    ):
        pack(src, tmp_path / "failed", failing, quiet=True)


def fail_on_row_37(sample: dict[str, bytes]) -> dict[str, bytes]:
    """A map that fails on one row (module-level: the pack's workers import it)."""
    if sample["__key__"] == "train/0000000037":
        raise ValueError("not this one")
    return sample


def test_images_are_prepared_from_rows(tmp_path: Path) -> None:
    from PIL import Image

    encoded = io.BytesIO()
    Image.new("RGB", (64, 32), (200, 10, 10)).save(encoded, format="PNG")
    table = pa.table({"image": pa.array([{"bytes": encoded.getvalue(), "path": None}] * 3, IMAGE)})
    pq.write_table(table, tmp_path / "train-00000-of-00001.parquet")
    options = PackOptions(format="tar", image_max_side=16)
    pack(tmp_path / "train-00000-of-00001.parquet", tmp_path / "out", options, quiet=True)
    samples = read_samples(tmp_path / "out")
    assert sorted(samples) == ["train/0000000000", "train/0000000001", "train/0000000002"]
    assert Image.open(io.BytesIO(samples["train/0000000001"]["png"])).size == (16, 8)  # named by its bytes


def test_a_key_column_and_a_hash_split(tmp_path: Path) -> None:
    table = hf_table(0, 40).append_column("id", pa.array([f"item-{i:03d}" for i in range(40)]))
    pq.write_table(table, tmp_path / "items.parquet")
    options = PackOptions(format="tar", key_column="id", split={"train": 0.5, "val": 0.5}, seed=3)
    manifest = pack(tmp_path / "items.parquet", tmp_path / "out", options, quiet=True).manifest
    assert list(manifest.splits) == ["train", "val"] and manifest.split_rule["fractions"] == options.split
    samples = read_samples(tmp_path / "out")
    assert sorted(samples) == [f"item-{i:03d}" for i in range(40)]
    assert samples["item-007"]["png"] == PNG + b"7" and "id" not in manifest.fields
    duplicated = table.set_column(table.schema.get_field_index("id"), "id", pa.array(["a", "b"] * 20))
    pq.write_table(duplicated, tmp_path / "twice.parquet", row_group_size=5)
    with pytest.raises(
        DataError, match=r"twice\.parquet row 3: key 'a' appears more than once \(also .*row 1\)"
    ):
        scan_source(tmp_path / "twice.parquet", key_column="id")
    with pytest.raises(UsageError, match=r"key column 'nope' is not a column of .*items\.parquet"):
        scan_source(tmp_path / "items.parquet", key_column="nope")


def test_a_parquet_list_with_a_key_column_is_still_a_file_list(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"abc")
    pq.write_table(pa.table({"key": ["s0"], "bin": ["a.bin"]}), tmp_path / "list.parquet")
    scan = scan_source(tmp_path / "list.parquet")
    assert scan.kind == "list" and scan.table.columns[0] == [str(tmp_path / "a.bin")]
    with pytest.raises(UsageError, match="a key column applies to a Parquet dataset"):
        scan_source(tmp_path / "list.parquet", key_column="key")


def test_missing_and_unusable_cells(tmp_path: Path) -> None:
    table = hf_table(0, 6, features=None)
    images = table.column("image").to_pylist()
    images[2] = None  # a null struct: the sample lacks the image
    pq.write_table(table.set_column(0, "image", pa.array(images, IMAGE)), tmp_path / "holes.parquet")
    with pytest.raises(IncompleteSamplesError, match="'train/0000000002' has no png"):
        scan_source(tmp_path / "holes.parquet")
    assert len(scan_source(tmp_path / "holes.parquet", skip_incomplete=True).table) == 5
    images[2] = {"bytes": None, "path": "/elsewhere/x.png"}
    pq.write_table(table.set_column(0, "image", pa.array(images, IMAGE)), tmp_path / "path.parquet")
    with pytest.raises(
        DataError, match=r"path\.parquet row 3, column 'image': no bytes, only the path.*embed_table"
    ):
        scan_source(tmp_path / "path.parquet")
    images[2] = {"bytes": b"\xff\xd8\xff rest", "path": "x.jpg"}
    pq.write_table(table.set_column(0, "image", pa.array(images, IMAGE)), tmp_path / "mixed.parquet")
    with pytest.raises(UsageError, match=r"column 'image' .* several types \(jpg, png\).* image=NAME"):
        scan_source(tmp_path / "mixed.parquet")
    assert "jpg" in scan_source(tmp_path / "mixed.parquet", field_map={"image": "jpg"}).table.fields
    ragged = pa.table({"m": pa.array([[[1, 2], [3]]], pa.list_(pa.list_(pa.int64())))})
    pq.write_table(ragged, tmp_path / "ragged.parquet")
    with pytest.raises(DataError, match=r"ragged\.parquet row 1, column 'm': a list of numbers that is not"):
        scan_source(tmp_path / "ragged.parquet")


def test_columns_no_field_can_hold_are_usage_errors_naming_them(tmp_path: Path) -> None:
    nested = hf_table(0, 3).append_column("meta", pa.array([{"a": 1, "b": "x"}] * 3))
    pq.write_table(nested, tmp_path / "nested.parquet")
    with pytest.raises(
        UnusableColumnError, match=r"column 'meta' of .*nested\.parquet is struct<a: int64, b: string>"
    ):
        scan_source(tmp_path / "nested.parquet")
    assert "meta" not in scan_source(tmp_path / "nested.parquet", field_map={"meta": ""}).table.fields
    categorical = pa.table({"tag": pa.array(["x", "y", "x"]).dictionary_encode()})
    pq.write_table(categorical, tmp_path / "categorical.parquet")
    scan = scan_source(tmp_path / "categorical.parquet")
    assert scan.table.columns[0] == [b"x", b"y", b"x"]  # a dictionary column is its values
    mapped = pa.table({"m": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64()))})
    pq.write_table(mapped, tmp_path / "map.parquet")
    result = CliRunner().invoke(
        main, ["pack", str(tmp_path / "map.parquet"), str(tmp_path / "o"), "--format", "tar"]
    )
    assert result.exit_code == 2
    assert "column 'm'" in result.output and "map<string, int64" in result.output
    assert "pass --field m= to leave it out" in result.output
    with pytest.raises(UsageError, match=r"the field mapping names 'nope', not columns"):
        scan_source(tmp_path / "nested.parquet", field_map={"nope": "x"})


def test_an_unreadable_parquet_file_names_itself(tmp_path: Path) -> None:
    src = hub_folder(tmp_path / "hub")
    (src / "data" / "test-00000-of-00001.parquet").write_bytes(b"not parquet at all")
    result = CliRunner().invoke(main, ["pack", str(src), str(tmp_path / "out"), "--format", "tar", "-q"])
    assert result.exit_code == 1
    assert "cannot read Parquet file" in result.output and "test-00000-of-00001.parquet" in result.output


def test_features_come_from_the_card_when_the_files_have_none(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    pq.write_table(hf_table(0, 5, features=None), tmp_path / "data" / "train-00000-of-00001.parquet")
    (tmp_path / "README.md").write_text(
        "---\ndataset_info:\n  features:\n  - name: label\n    dtype:\n      class_label:\n        names:\n"
        "          '0': cat\n          '1': dog\n          '2': bird\n  - name: text\n    dtype: string\n"
        "---\n# card\n"
    )
    scan = scan_source(tmp_path)
    assert scan.kind == "parquet" and scan.classes == ("cat", "dog", "bird")
    assert scan.details["features_from"] == "README.md dataset_info"


def test_a_folder_of_several_configurations_is_refused(tmp_path: Path) -> None:
    for config in ("en", "fr"):
        (tmp_path / config).mkdir()
        pq.write_table(hf_table(0, 3), tmp_path / config / "train-00000-of-00001.parquet")
    with pytest.raises(UsageError, match=r"split 'train' in several folders \(en/, fr/\)"):
        scan_source(tmp_path)


def test_blob_names() -> None:
    assert blob_name("a/b/photo.JPEG", b"", "image") == "jpeg"
    assert blob_name(None, b"RIFF\0\0\0\0WAVEfmt ", "audio") == "wav"
    assert blob_name("", b"fLaC...", "audio") == "flac"
    assert blob_name("noext", b"unknown", "image") == "image"


def test_the_cli_packs_a_downloaded_hub_folder(tmp_path: Path) -> None:
    src = hub_folder(tmp_path / "hub")
    args = ["pack", str(src), str(tmp_path / "out"), "--format", "tar", "--field", "label=cls,emb=", "-q"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "train: 55 samples" in result.output and "test: 10 samples" in result.output
    assert load_manifest(tmp_path / "out").fields == ("cls", "ids.npy", "png", "text")
    bad = CliRunner().invoke(
        main, ["pack", str(src), str(tmp_path / "x"), "--format", "tar", "--field", "label"]
    )
    assert bad.exit_code == 2 and "expected COLUMN=FIELD pairs" in bad.output


def test_a_hub_folder_in_a_bucket_packs_like_a_local_one(tmp_path: Path, s3: S3Server, s3_root: str) -> None:
    """Listed as a prefix, footers and row groups read through the storage seam, the card fetched."""
    src = hub_folder(tmp_path / "hub", train=(12,), test=5)
    (src / "README.md").write_text(
        "---\ndataset_info:\n  features:\n  - name: label\n    dtype:\n      class_label:\n        names:\n"
        "          '0': a\n          '1': b\n          '2': c\n---\n"
    )
    for name in ("data/train-00000-of-00001.parquet", "data/test-00000-of-00001.parquet"):
        table = pq.read_table(src / name).replace_schema_metadata(None)  # the card is the only features
        pq.write_table(table, src / name, row_group_size=4)
    options = s3.storage_options()
    store = open_store(s3_root, storage_options=options)
    for path in files_of(src):
        store.put(f"hub/{path}", (src / path).read_bytes())
    local = pack(src, tmp_path / "local", PackOptions(format="tar"), quiet=True).manifest
    remote = pack(f"{s3_root}/hub", tmp_path / "remote", PackOptions(format="tar"), quiet=True,
                  storage_options=options).manifest  # fmt: skip
    assert remote.classes == local.classes == ("a", "b", "c")
    assert [s.sha256 for s in remote.splits["test"]] == [s.sha256 for s in local.splits["test"]]
    assert remote.source["files"] == 2 and remote.fields == local.fields


def test_positional_keys_stay_when_a_split_grows(tmp_path: Path) -> None:
    """push_to_hub renames every file when it adds one (-of-00002 -> -of-00003): rows keep their keys."""
    src = hub_folder(tmp_path / "hub", train=(30, 25))
    before = scan_source(src).table
    for number in range(2):
        old = src / "data" / f"train-{number:05d}-of-00002.parquet"
        old.rename(src / "data" / f"train-{number:05d}-of-00003.parquet")
    pq.write_table(hf_table(55, 20), src / "data" / "train-00002-of-00003.parquet")
    after = scan_source(src).table
    assert len(after) == len(before) + 20 and after.keys == sorted(after.keys)
    rows = {key: i for i, key in enumerate(after.keys)}
    for i, key in enumerate(before.keys):
        assert [column[rows[key]] for column in after.columns] == [column[i] for column in before.columns]
    assert after.keys[-1] == "train/0000000074"
