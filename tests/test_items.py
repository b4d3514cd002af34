"""pack_items: samples made in Python from items, in parallel, with the guarantees of a pack's map."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardpipe import PackOptions, pack_items
from shardpipe.errors import UsageError
from shardpipe.packing import items as items_module
from shardpipe.packing.mapping import MapError
from shardpipe.packing.output import JobMismatchError
from tests.maps import make_item
from tests.test_pack import PicklingExecutor, read_back, read_shards, tree_files

ITEMS = list(range(60))


def expected_keys() -> set[str]:
    keys = set()
    for item in ITEMS:
        made = make_item(item)
        for sample in made if isinstance(made, list) else [made] if made else []:
            keys.add(sample["__key__"])
    return keys


def test_items_pack_to_the_same_bytes_for_any_workers_or_executor(tmp_path: Path) -> None:
    options = PackOptions(format="tar", split={"train": 0.7, "val": 0.3}, max_samples=9)
    outs = []
    for workers in (1, 2):
        pack_items(ITEMS, "tests.maps:make_item", tmp_path / f"w{workers}",
                   PackOptions(**{**_fields(options), "workers": workers}), quiet=True)  # type: ignore[arg-type]  # fmt: skip
        outs.append(tree_files(tmp_path / f"w{workers}"))
    with PicklingExecutor() as executor:
        result = pack_items(ITEMS, make_item, tmp_path / "shipped", options, quiet=True, executor=executor)
    outs.append(tree_files(tmp_path / "shipped"))
    assert outs[0] == outs[1] == outs[2]
    got = read_back(tmp_path / "w1")
    assert set(got["train"]) | set(got["val"]) == expected_keys()
    together = {"items/00003", "items/00003_extra"}  # one item's outputs never straddle splits
    assert together <= set(got["train"]) or together <= set(got["val"])
    assert result.manifest.source == {"kind": "items", "count": 60}
    assert result.manifest.job["options"]["map"]["name"] == "tests.maps:make_item"


def _fields(options: PackOptions) -> dict[str, object]:
    return {name: getattr(options, name) for name in options.__dataclass_fields__}


def test_sorted_keeps_the_items_order_and_hashed_mixes_it(tmp_path: Path) -> None:
    sorted_run = pack_items(
        ITEMS, make_item, tmp_path / "s", PackOptions(format="lmdb", order="sorted"), quiet=True
    )
    keys = [k for shard in _shard_keys(tmp_path / "s") for k in shard]
    assert keys == sorted(keys) and sorted_run.manifest.order["method"] == "sorted"
    pack_items(ITEMS, make_item, tmp_path / "h", PackOptions(format="lmdb"), quiet=True)
    hashed = [k for shard in _shard_keys(tmp_path / "h") for k in shard]
    assert sorted(hashed) == keys and hashed != keys
    assert hashed.index("items/00003_extra") == hashed.index("items/00003") + 1  # an item's outputs together


def _shard_keys(out: Path) -> list[list[str]]:
    return [list(shard) for shard in read_shards(out)["train"]]


def test_failing_items_stop_the_pack_or_are_skipped_and_named(tmp_path: Path) -> None:
    with pytest.raises(MapError, match=r"the map failed on item 7 .*item seven cannot be made"):
        pack_items(
            ITEMS, "tests.maps:fail_on_item_seven", tmp_path / "a", PackOptions(format="tar"), quiet=True
        )
    options = PackOptions(format="tar", on_error="skip")
    result = pack_items(ITEMS, "tests.maps:fail_on_item_seven", tmp_path / "b", options, quiet=True)
    assert result.num_skipped_failed == 1 and result.manifest.skipped["samples"][0]["key"] == "item 7"


def test_a_finished_job_is_a_no_op_and_other_items_refuse_to_resume(tmp_path: Path) -> None:
    out = tmp_path / "out"
    pack_items(ITEMS, make_item, out, PackOptions(format="tfrecord"), quiet=True)
    again = pack_items(ITEMS, make_item, out, PackOptions(format="tfrecord", resume=True), quiet=True)
    assert again.already_complete and again.num_written == 0
    with pytest.raises(JobMismatchError, match="content changed"):
        pack_items([*ITEMS, 60], make_item, out, PackOptions(format="tfrecord", resume=True), quiet=True)


def test_pieces_follow_the_item_count_only() -> None:
    assert [len(p) for p in items_module.plan_item_pieces(list(range(10)), ".tar")] == [1] * 10
    pieces = items_module.plan_item_pieces(list(range(1000)), ".tar")
    assert len(pieces) == 63 and {len(p) for p in pieces[:-1]} == {16}
    assert pieces[5].first_item == 80


def test_options_that_describe_files_are_refused() -> None:
    with pytest.raises(UsageError, match=r"options\.map must be None"):
        pack_items(ITEMS, make_item, "x", PackOptions(format="tar", map="tests.maps:unchanged"))
    with pytest.raises(UsageError, match="labels"):
        pack_items(ITEMS, make_item, "x", PackOptions(format="tar", labels="dirname"))
