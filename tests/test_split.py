from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardpipe.errors import DataError, UsageError
from shardpipe.sources import SampleSource, split_key
from shardpipe.split import assign_splits, cut_shards, parse_size, parse_split


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("a/0001.jpg", ("a/0001", "jpg")),
        ("a/0001.seg.png", ("a/0001", "seg.png")),
        ("0001.cls", ("0001", "cls")),
        ("a.b/0001.txt", ("a.b/0001", "txt")),
        ("README", None),
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


def _samples(keys: list[str], size: int = 10) -> list[SampleSource]:
    return [SampleSource(k, {"bin": b"x" * size}, size) for k in keys]


def test_split_is_stable_when_files_are_added() -> None:
    fractions = {"train": 0.8, "val": 0.1, "test": 0.1}
    before = assign_splits(_samples([f"k{i}" for i in range(2000)]), fractions, seed=7)
    after = assign_splits(_samples([f"k{i}" for i in range(5000)]), fractions, seed=7)
    for name in fractions:
        old = {s.key for s in before[name]}
        new = {s.key for s in after[name] if int(s.key[1:]) < 2000}
        assert old == new
    sizes = {name: len(after[name]) / 5000 for name in fractions}
    assert abs(sizes["train"] - 0.8) < 0.03 and abs(sizes["val"] - 0.1) < 0.02
    other_seed = assign_splits(_samples([f"k{i}" for i in range(2000)]), fractions, seed=8)
    assert {s.key for s in other_seed["val"]} != {s.key for s in before["val"]}


@given(
    st.lists(st.integers(1, 50), min_size=0, max_size=60),
    st.one_of(st.none(), st.integers(1, 7)),
    st.one_of(st.none(), st.integers(50, 200)),
)
def test_cut_shards_respects_limits_and_order(
    sizes: list[int], max_samples: int | None, max_bytes: int | None
) -> None:
    samples = [SampleSource(f"{i:04d}", {"bin": b""}, size) for i, size in enumerate(sizes)]
    shards = cut_shards(samples, max_samples=max_samples, max_bytes=max_bytes)
    assert [s for shard in shards for s in shard] == samples
    for i, shard in enumerate(shards):
        assert shard
        assert max_samples is None or len(shard) <= max_samples
        assert max_bytes is None or sum(s.num_bytes for s in shard) <= max_bytes
        if i + 1 < len(shards):  # a shard is cut only when the next sample would not fit
            nxt = shards[i + 1][0]
            assert (max_samples is not None and len(shard) == max_samples) or (
                max_bytes is not None and sum(s.num_bytes for s in shard) + nxt.num_bytes > max_bytes
            )


def test_sample_larger_than_max_bytes_is_an_error() -> None:
    with pytest.raises(DataError, match=r"'big'.*more than --max-bytes"):
        cut_shards([SampleSource("big", {"bin": b""}, 1000)], max_samples=None, max_bytes=999)


def test_parse_size() -> None:
    assert parse_size("256MB") == 256_000_000
    assert parse_size("64KiB") == 65536
    assert parse_size("1000") == 1000
    assert parse_size("1.5GB") == 1_500_000_000
    for bad in ["", "12XB", "-5MB", "0"]:
        with pytest.raises(UsageError):
            parse_size(bad)
