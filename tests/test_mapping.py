"""Packing with a map: the outputs' shards are the same for any worker count, engine or piece size, the
map is part of the job, failing samples stop the pack or are skipped and named, outputs are checked."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from shardpipe.cli import main
from shardpipe.errors import DataError
from shardpipe.manifest import load_manifest
from shardpipe.packing import PackOptions, pack
from shardpipe.packing.mapping import MapError
from shardpipe.packing.mapping import pieces as map_pieces
from shardpipe.packing.mapping import shards as map_shards
from shardpipe.packing.output import JobMismatchError
from shardpipe.packing.samples import SampleError
from shardpipe.storage import open_store
from shardpipe.tools.verify import verify
from testkit.servers import S3Server
from tests.datagen import make_tree
from tests.test_pack import PicklingExecutor, read_back, tree_files

FORMATS = ["tar", "lmdb", "tfrecord"]


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several pieces per planned shard, so shards are written from the staged shards of several pieces."""
    monkeypatch.setattr(map_pieces, "MIN_PIECES", 30)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("split_pieces", [False, True], ids=["moved", "rewritten"])
def test_a_map_that_changes_nothing_writes_the_shards_of_no_map(
    tmp_path: Path, fmt: str, split_pieces: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a piece per planned shard each staged shard is moved into place, never written again; with
    several pieces per shard they are read back and rewritten: the same bytes either way."""
    make_tree(tmp_path / "src", 150)
    plain = pack(tmp_path / "src", tmp_path / "plain", PackOptions(format=fmt, max_samples=16), quiet=True)
    if split_pieces:
        monkeypatch.setattr(map_pieces, "MIN_PIECES", 30)
    else:
        monkeypatch.setattr(map_shards, "local_copy", _never)  # 10 shards: one piece each, none read back
    options = PackOptions(format=fmt, max_samples=16, map="tests.maps:unchanged", workers=1)
    mapped = pack(tmp_path / "src", tmp_path / "mapped", options, quiet=True)
    for split, shards in plain.manifest.splits.items():
        for ours, theirs in zip(mapped.manifest.splits[split], shards, strict=True):
            assert ours == theirs  # same path, count, bytes, sha256, index
    assert tree_files(tmp_path / "mapped").keys() == tree_files(tmp_path / "plain").keys()
    assert not (tmp_path / "mapped" / map_pieces.STAGING).exists()
    assert mapped.manifest.job["options"]["map"]["name"] == "tests.maps:unchanged"
    assert verify(tmp_path / "mapped", quiet=True) == []


def _never(*args: object) -> None:
    raise AssertionError("a staged shard that is a whole shard is moved, not written again")


def test_outputs_are_byte_identical_for_any_workers_executor_and_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tree(tmp_path / "src", 80)
    options = PackOptions(format="tar", max_samples=25, split={"a": 0.5, "b": 0.5}, map="tests.maps:twice")
    outs = []
    for workers in (1, 2):
        with_workers = PackOptions(**{**_fields(options), "workers": workers})  # type: ignore[arg-type]
        pack(tmp_path / "src", tmp_path / f"w{workers}", with_workers, quiet=True)
        outs.append(tree_files(tmp_path / f"w{workers}"))
    with PicklingExecutor() as executor:
        pack(tmp_path / "src", tmp_path / "shipped", options, quiet=True, executor=executor)
    assert set(executor.tasks) >= {
        "shardpipe.packing.mapping.pieces.map_piece",
        "shardpipe.packing.mapping.shards.write_mapped_shard",
    }
    outs.append(tree_files(tmp_path / "shipped"))
    assert outs[0] == outs[1] == outs[2]
    monkeypatch.setattr(map_pieces, "MIN_PIECES", 40)  # pieces are planned work: the job's, not the shards'
    pack(tmp_path / "src", tmp_path / "pieces", options, quiet=True)
    shards = {name: data for name, data in tree_files(tmp_path / "pieces").items() if name != "manifest.json"}
    assert shards == {name: data for name, data in outs[0].items() if name != "manifest.json"}
    manifest = load_manifest(tmp_path / "w1")
    counts = [s.num_samples for shards in manifest.splits.values() for s in shards]
    assert sum(counts) == 160 and max(counts) == 25  # the limits count outputs: 2 per input


def _fields(options: PackOptions) -> dict[str, object]:
    return {name: getattr(options, name) for name in options.__dataclass_fields__}


@pytest.mark.parametrize(("function", "expected"), [("twice", 120), ("drop_odd", 30)])
def test_one_input_may_become_many_or_none(tmp_path: Path, function: str, expected: int) -> None:
    samples = make_tree(tmp_path / "src", 60)
    options = PackOptions(format="lmdb", map=f"tests.maps:{function}")
    result = pack(tmp_path / "src", tmp_path / "out", options, quiet=True)
    got = read_back(tmp_path / "out")["train"]
    assert len(got) == expected == sum(s.num_samples for s in result.manifest.splits["train"])
    if function == "twice":
        assert got["cls0/00003_b"] == samples["cls0/00003"]
    else:
        assert set(got) == {key for key in samples if int(key[-1]) % 2 == 0}


def test_the_shard_limits_count_what_the_map_returns(tmp_path: Path, small_pieces: None) -> None:
    make_tree(tmp_path / "src", 40, size=100, fields=("bin",))
    result = pack(tmp_path / "src", tmp_path / "out", PackOptions(format="tar", max_bytes=1500,
                  map="tests.maps:grow"), quiet=True)  # fmt: skip
    shards = result.manifest.splits["train"]
    assert len(shards) > 8 and all(s.num_samples <= 5 for s in shards)  # 3 x ~103 bytes per output


def test_a_failing_sample_stops_the_pack_naming_it_and_leaves_no_shard(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 30)
    result = run("pack", tmp_path / "src", tmp_path / "out", "--format", "tar", "--map",
                 "tests.maps:fail_on_sevens", "-q")  # fmt: skip
    assert result.exit_code == 1, result.output
    assert (
        "the map failed on sample 'cls" in result.output and "ValueError: no sevens please" in result.output
    )
    assert "00007.bin" in result.output or "00017.bin" in result.output or "00027.bin" in result.output
    assert not list((tmp_path / "out").rglob("shard-*")) and not (tmp_path / "out" / "manifest.json").exists()


def test_skip_leaves_failing_samples_out_counts_and_names_them(tmp_path: Path) -> None:
    samples = make_tree(tmp_path / "src", 30)
    result = run("pack", tmp_path / "src", tmp_path / "out", "--format", "tfrecord", "--map",
                 "tests.maps:fail_on_sevens", "--on-error", "skip", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "skipped 3 sample(s) the map or image preparation failed on" in result.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["skipped"]["count"] == 3
    assert sorted(s["key"] for s in manifest["skipped"]["samples"]) == [
        "cls0/00027",
        "cls1/00007",
        "cls2/00017",
    ]
    assert all(s["error"].startswith("ValueError: no sevens please") for s in manifest["skipped"]["samples"])
    assert set(read_back(tmp_path / "out")["train"]) == {k for k in samples if not k.endswith("7")}


def test_the_manifest_names_a_capped_number_of_skipped_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tree(tmp_path / "src", 40)
    monkeypatch.setattr(map_pieces, "MAX_SKIPPED_NAMED", 2)
    options = PackOptions(format="tar", map="tests.maps:fail_on_sevens", on_error="skip")
    result = pack(tmp_path / "src", tmp_path / "out", options, quiet=True)
    assert result.num_skipped_failed == 4
    assert result.manifest.skipped["count"] == 4 and len(result.manifest.skipped["samples"]) == 2


@pytest.mark.parametrize(
    ("function", "error", "message"),
    [
        ("text_not_bytes", SampleError, "field 'txt' is str, expected bytes; encode it"),
        ("changed_in_place", SampleError, "field 'txt' is str, expected bytes; encode it"),
        ("bad_key", SampleError, "its last part holds a dot"),
        ("same_key", MapError, "returned the key 'one/key' twice"),
        ("odd_fields", MapError, "every sample must have the same fields"),
    ],
)
def test_outputs_are_checked_with_clear_errors(
    tmp_path: Path, function: str, error: type[DataError], message: str
) -> None:
    make_tree(tmp_path / "src", 12)
    options = PackOptions(format="tar", map=f"tests.maps:{function}", workers=1)
    with pytest.raises(DataError, match=message) as caught:
        pack(tmp_path / "src", tmp_path / "out", options, quiet=True)
    assert isinstance(caught.value, (error, MapError))  # a bad output is the sample's failure, named


def test_the_map_is_part_of_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_tree(tmp_path / "src", 30)
    module = tmp_path / "usermap.py"
    module.write_text("def prepare(sample):\n    return sample\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    first = PackOptions(format="tar", map="usermap:prepare", map_version="1")
    pack(tmp_path / "src", out, first, quiet=True)
    again = pack(tmp_path / "src", out, PackOptions(**{**_fields(first), "resume": True}), quiet=True)
    assert again.already_complete and again.num_written == 0
    with pytest.raises(JobMismatchError, match=r"map: found .*'version': '1'.*'version': '2'"):
        pack(tmp_path / "src", out, PackOptions(**{**_fields(first), "resume": True, "map_version": "2"}),
             quiet=True)  # fmt: skip
    module.write_text("def prepare(sample):\n    return dict(sample)\n")  # the same name, other source
    importlib.reload(sys.modules["usermap"])
    with pytest.raises(JobMismatchError, match="source_sha256"):
        pack(tmp_path / "src", out, PackOptions(**{**_fields(first), "resume": True}), quiet=True)


def test_an_interrupted_pack_with_a_map_resumes_keeping_mapped_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_pieces: None
) -> None:
    make_tree(tmp_path / "src", 60)
    options = PackOptions(format="tar", max_samples=16, map="tests.maps:twice", workers=1)
    reference = pack(tmp_path / "src", tmp_path / "reference", options, quiet=True)
    calls = 0
    original = map_pieces.map_piece

    def killed_at_the_fourth(*args: object) -> map_pieces.MappedPiece:
        nonlocal calls
        calls += 1
        if calls == 4:
            raise KeyboardInterrupt("killed")
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr("shardpipe.packing.driver.map_piece", killed_at_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        pack(tmp_path / "src", tmp_path / "out", options, quiet=True)
    monkeypatch.undo()
    journal = (tmp_path / "out" / ".shardpipe-journal.jsonl").read_text().splitlines()
    assert sum('"piece"' in line for line in journal) == 3
    mapped: list[int] = []
    monkeypatch.setattr(map_pieces, "MIN_PIECES", 30)
    monkeypatch.setattr("shardpipe.packing.driver.map_piece", lambda piece, *a: mapped.append(piece.index)
                        or original(piece, *a))  # fmt: skip
    resumed = pack(tmp_path / "src", tmp_path / "out", PackOptions(**{**_fields(options), "resume": True}),
                   quiet=True)  # fmt: skip
    assert 0 not in mapped and 1 not in mapped and 2 not in mapped and mapped  # the journaled pieces stay
    assert resumed.manifest == reference.manifest
    assert tree_files(tmp_path / "out") == tree_files(tmp_path / "reference")


@pytest.mark.parametrize("split_pieces", [False, True], ids=["moved", "rewritten"])
def test_a_pack_with_a_map_into_a_bucket_equals_the_local_one(
    tmp_path: Path, s3: S3Server, s3_root: str, split_pieces: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staged shards live in the bucket too: moved within it, or read back and rewritten."""
    if split_pieces:
        monkeypatch.setattr(map_pieces, "MIN_PIECES", 12)
    make_tree(tmp_path / "src", 40)
    options = PackOptions(format="tar", max_samples=10, map="tests.maps:unchanged", workers=1)
    local = pack(tmp_path / "src", tmp_path / "local", options, quiet=True)
    remote = pack(tmp_path / "src", s3_root, options, quiet=True, storage_options=s3.storage_options())
    store = open_store(s3_root, storage_options=s3.storage_options())
    files = {k: store.read(k) for k in store.list_keys() if k != "manifest.json"}
    assert files == {k: v for k, v in tree_files(tmp_path / "local").items() if k != "manifest.json"}
    assert remote.manifest.splits == local.manifest.splits
