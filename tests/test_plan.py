"""The pack plan: order, cuts, the job fingerprint and the options that shape it, without writing."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardpipe.errors import UsageError
from shardpipe.packing.options import JOB_OPTIONS, PackOptions
from shardpipe.packing.plan import (
    SampleTooLargeError,
    cut_runs,
    cut_shards,
    fingerprint,
    hashed_order,
    plan_jobs,
)
from shardpipe.packing.split import split_unit
from shardpipe.sources import SampleTable, scan_source
from shardpipe.units import parse_size
from tests.datagen import make_tree


def _table(keys: list[str]) -> SampleTable:
    sizes = np.full((len(keys), 1), 10, dtype=np.int64)
    return SampleTable(keys, ("cls",), [[key.split("/")[0].encode() for key in keys]], sizes)


def _class_sorted_keys(num_classes: int, per_class: int) -> list[str]:
    return sorted(f"c{c:02d}/{i:04d}" for c in range(num_classes) for i in range(per_class))


def test_hashed_order_is_stable_when_keys_are_added() -> None:
    keys = sorted(f"k{i:05d}" for i in range(3000))
    some = keys[::3]
    placed_all = [keys[row] for row in hashed_order(keys, seed=5)]
    placed_some = [some[row] for row in hashed_order(some, seed=5)]
    kept = set(some)
    assert [key for key in placed_all if key in kept] == placed_some
    assert sorted(placed_all) == keys  # a permutation
    assert placed_all != keys
    assert [keys[row] for row in hashed_order(keys, seed=6)] != placed_all


def test_hashed_order_uses_its_own_hash_domain() -> None:
    """Ordering by the split's own hash would put each split's samples in one contiguous range of it."""
    keys = sorted(f"k{i:05d}" for i in range(2000))
    by_split_hash = sorted(keys, key=lambda key: split_unit(key, 0))
    by_order = [keys[row] for row in hashed_order(keys, seed=0)]
    assert by_order != by_split_hash
    ranks = np.argsort(np.argsort([split_unit(key, 0) for key in by_order]))
    assert abs(np.corrcoef(ranks, np.arange(len(keys)))[0, 1]) < 0.1


def test_hashed_shards_mix_classes_and_sorted_shards_do_not() -> None:
    table = _table(_class_sorted_keys(10, 100))
    for order, expected in (("hashed", (8, 10)), ("sorted", (1, 2))):
        jobs = plan_jobs(table, ".tar", PackOptions(format="tar", order=order, max_samples=50))
        classes_per_shard = [len(set(job.samples.columns[0])) for job in jobs]
        low, high = expected
        assert all(low <= n <= high for n in classes_per_shard), (order, classes_per_shard)
    sorted_jobs = plan_jobs(table, ".tar", PackOptions(format="tar", order="sorted", max_samples=50))
    assert [key for job in sorted_jobs for key in job.samples.keys] == table.keys


def test_each_split_is_ordered_by_the_hash_and_keeps_its_samples() -> None:
    keys = _class_sorted_keys(4, 250)
    options = PackOptions(format="tar", split={"train": 0.7, "val": 0.3}, seed=3, max_samples=64)
    jobs = plan_jobs(_table(keys), ".tar", options)
    sorted_jobs = plan_jobs(_table(keys), ".tar", PackOptions(**{**_fields(options), "order": "sorted"}))
    for split in ("train", "val"):
        hashed = [k for job in jobs if job.split == split for k in job.samples.keys]
        plain = [k for job in sorted_jobs if job.split == split for k in job.samples.keys]
        assert sorted(hashed) == plain  # the same samples, split by the same rule
        assert hashed == [plain[row] for row in hashed_order(plain, seed=3)]
    assert [job.relpath for job in jobs][:2] == ["train/shard-000000.tar", "train/shard-000001.tar"]


def _fields(options: PackOptions) -> dict[str, object]:
    return {name: getattr(options, name) for name in PackOptions.__dataclass_fields__}


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


def test_sample_larger_than_max_bytes_is_an_error_that_pickles() -> None:
    with pytest.raises(SampleTooLargeError, match=r"'big' holds 1,000 bytes.*max_bytes=999") as caught:
        cut_shards(["small", "big"], np.array([10, 1000]), max_samples=None, max_bytes=999)
    again = pickle.loads(pickle.dumps(caught.value))
    assert (again.key, again.num_bytes, again.max_bytes, str(again)) == ("big", 1000, 999, str(caught.value))


def test_cut_runs_gives_an_oversized_sample_a_run_of_its_own() -> None:
    runs = cut_runs(np.array([5, 1000, 5, 5]), max_samples=None, max_bytes=10)
    assert runs == [slice(0, 1), slice(1, 2), slice(2, 4)]


def test_fingerprint_follows_paths_values_sizes_and_every_job_option(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 6, fields=("bin",))
    options = PackOptions(format="tar", labels="dirname")
    table = scan_source(tmp_path / "src", labels="dirname").table

    def print_of(columns: list[list[str | bytes]], sizes: np.ndarray, opts: PackOptions = options) -> str:
        changed = SampleTable(table.keys, table.fields, columns, sizes)
        return fingerprint([(j.relpath, j.samples) for j in plan_jobs(changed, ".tar", opts)], opts)

    original = print_of(table.columns, table.sizes)
    paths, labels = table.columns
    assert print_of([[*paths[:-1], paths[-1] + "x"], labels], table.sizes) != original
    assert print_of([paths, [*labels[:-1], b"9"]], table.sizes) != original
    assert print_of(table.columns, table.sizes + 1) != original
    changed_options = {
        "format": "lmdb", "split": {"a": 0.5, "b": 0.5}, "seed": 1, "order": "sorted", "max_samples": 2,
        "max_bytes": 10**6, "labels": None, "literal_fields": ("x",), "skip_incomplete": True,
    }  # fmt: skip
    assert set(changed_options) == set(JOB_OPTIONS)
    for name, value in changed_options.items():
        other = PackOptions(**{**_fields(options), name: value})  # type: ignore[arg-type]
        assert print_of(table.columns, table.sizes, other) != original, name
    for name, value in {"workers": 3, "resume": True}.items():  # how a job runs is not what it is
        same = PackOptions(**{**_fields(options), name: value})  # type: ignore[arg-type]
        assert print_of(table.columns, table.sizes, same) == original, name


def test_options_are_checked_and_their_job_part_is_json_safe() -> None:
    for bad in ({"order": "random"}, {"workers": 0}, {"max_samples": 0}, {"max_bytes": 0}, {"format": "zip"}):
        with pytest.raises(UsageError):
            PackOptions(**{"format": "tar", **bad})  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="resume and overwrite"):
        PackOptions(format="tar", resume=True, overwrite=True)
    options = PackOptions(format="tar", literal_fields=("txt",))
    assert options.job_options()["literal_fields"] == ["txt"]
    assert options.order_rule()["method"] == "hashed" and options.order_rule()["seed"] == 0
    assert "seed" not in PackOptions(format="tar", order="sorted").order_rule()


def test_parse_size() -> None:
    assert parse_size("256MB") == 256_000_000
    assert parse_size("64KiB") == 65536
    assert parse_size("1000") == 1000
    assert parse_size("1.5GB") == 1_500_000_000
    for bad in ["", "12XB", "-5MB", "0"]:
        with pytest.raises(UsageError):
            parse_size(bad)


def test_hashed_order_is_the_documented_hash_even_for_keys_holding_nul() -> None:
    import hashlib

    keys = sorted(["a", "b\0c", "d", "é/1", "z"])
    expected = sorted(
        range(len(keys)),
        key=lambda row: hashlib.blake2b(
            f"7:{keys[row]}".encode(), digest_size=8, person=b"shardpipe-order"
        ).digest(),
    )
    assert hashed_order(keys, seed=7) == expected
    assert hashed_order([], seed=7) == []
