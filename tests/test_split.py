"""Where a key ends, and which split a key belongs to."""

from __future__ import annotations

import pytest

from shardpipe.errors import UsageError
from shardpipe.packing.split import assign_splits, parse_split
from shardpipe.sources.tree import split_key


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("a/0001.jpg", ("a/0001", "jpg")),
        ("a/0001.seg.png", ("a/0001", "seg.png")),
        ("0001.cls", ("0001", "cls")),
        ("a.b/0001.txt", ("a.b/0001", "txt")),
        ("README", None),
        ("a/b/c.d.e", ("a/b/c", "d.e")),
        ("a/0001.", ("a/0001", "")),
    ],
)
def test_split_key_follows_webdataset(path: str, expected: tuple[str, str] | None) -> None:
    from webdataset.tariterators import base_plus_ext

    assert split_key(path) == expected
    wds = base_plus_ext(path)
    assert (None if wds == (None, None) else wds) == expected


def test_parse_split() -> None:
    assert parse_split(None) == {"train": 1.0}
    assert parse_split("train=0.9, val=0.1") == {"train": 0.9, "val": 0.1}
    for bad in ["train=0.9", "train", "train=x,val=1", "a=0.5,a=0.5", "tr ain=1", "train=0,val=1"]:
        with pytest.raises(UsageError):
            parse_split(bad)


def test_split_is_stable_when_files_are_added() -> None:
    fractions = {"train": 0.8, "val": 0.1, "test": 0.1}
    keys = [f"k{i}" for i in range(5000)]
    before = assign_splits(keys[:2000], fractions, seed=7)
    after = assign_splits(keys, fractions, seed=7)
    for name in fractions:
        assert before[name] == [row for row in after[name] if row < 2000]
        assert before[name] == sorted(before[name])
    assert sorted(row for rows in after.values() for row in rows) == list(range(5000))
    sizes = {name: len(after[name]) / 5000 for name in fractions}
    assert abs(sizes["train"] - 0.8) < 0.03 and abs(sizes["val"] - 0.1) < 0.02
    other_seed = assign_splits(keys[:2000], fractions, seed=8)
    assert other_seed["val"] != before["val"]
