from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardpipe.errors import DataError, UsageError
from shardpipe.plan import cut_runs, cut_shards, parse_size
from shardpipe.split import assign_splits, parse_split, split_key


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


@given(
    st.lists(st.integers(0, 50), min_size=0, max_size=60),
    st.one_of(st.none(), st.integers(1, 7)),
    st.one_of(st.none(), st.integers(50, 200)),
)
def test_cut_shards_respects_limits_and_order(
    sizes: list[int], max_samples: int | None, max_bytes: int | None
) -> None:
    num_bytes = np.array(sizes, dtype=np.int64)
    runs = cut_shards(
        [f"{i:04d}" for i in range(len(sizes))], num_bytes, max_samples=max_samples, max_bytes=max_bytes
    )
    assert [i for run in runs for i in range(len(sizes))[run]] == list(range(len(sizes)))
    for i, run in enumerate(runs):
        count, total = run.stop - run.start, int(num_bytes[run].sum())
        assert count > 0
        assert max_samples is None or count <= max_samples
        assert max_bytes is None or total <= max_bytes
        if i + 1 < len(runs):  # a shard is cut only when the next sample would not fit
            assert (max_samples is not None and count == max_samples) or (
                max_bytes is not None and total + int(num_bytes[run.stop]) > max_bytes
            )


def test_sample_larger_than_max_bytes_is_an_error() -> None:
    with pytest.raises(DataError, match=r"'big'.*more than --max-bytes"):
        cut_shards(["small", "big"], np.array([10, 1000]), max_samples=None, max_bytes=999)


def test_cut_runs_gives_an_oversized_sample_a_run_of_its_own() -> None:
    runs = cut_runs(np.array([5, 1000, 5, 5]), max_samples=None, max_bytes=10)
    assert runs == [slice(0, 1), slice(1, 2), slice(2, 4)]


def test_parse_size() -> None:
    assert parse_size("256MB") == 256_000_000
    assert parse_size("64KiB") == 65536
    assert parse_size("1000") == 1000
    assert parse_size("1.5GB") == 1_500_000_000
    for bad in ["", "12XB", "-5MB", "0"]:
        with pytest.raises(UsageError):
            parse_size(bad)
