"""The pack stage end to end through the CLI: formats, manifest, errors, reproducibility, crash + resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from shardpipe.cli import main
from shardpipe.formats import get_format
from shardpipe.formats.layout import ShardIndex
from shardpipe.manifest import load_manifest
from tests.datagen import make_tree, read_with_webdataset

FORMATS = ["tar", "lmdb", "tfrecord"]


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def read_back(out: Path) -> dict[str, dict[str, dict[str, bytes]]]:
    """Every sample of every split, read through the format's reader and the manifest's indexes."""
    manifest = load_manifest(out)
    fmt = get_format(manifest.format)
    splits: dict[str, dict[str, dict[str, bytes]]] = {}
    for name, shards in manifest.splits.items():
        samples = splits.setdefault(name, {})
        for shard in shards:
            index = None
            if shard.index_path:
                index = ShardIndex.read(out / shard.index_path, shard.num_samples, manifest.fields)
            for key, fields in fmt.read(out / shard.path, 0, shard.num_samples, index):
                assert key not in samples
                samples[key] = fields
    return splits


def tree_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("fmt", FORMATS)
def test_pack_tree_round_trip_verify_inspect(tmp_path: Path, fmt: str) -> None:
    expected = make_tree(tmp_path / "src", 60, classes=3)
    out = tmp_path / "out"
    options = ["--labels", "dirname", "--split", "train=0.8,val=0.2", "--seed", "3", "--max-samples", "7"]
    result = run("pack", tmp_path / "src", out, "--format", fmt, *options, "--workers", "2")
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == fmt
    assert manifest["fields"] == ["bin", "cls", "txt"]
    assert manifest["classes"] == ["cls0", "cls1", "cls2"]
    assert manifest["split_rule"]["seed"] == 3
    assert set(manifest["splits"]) == {"train", "val"}
    for split in manifest["splits"].values():
        assert split["samples"] == sum(s["samples"] for s in split["shards"])
        assert all(s["samples"] <= 7 and len(s["sha256"]) == 64 for s in split["shards"])
    assert manifest["splits"]["train"]["samples"] + manifest["splits"]["val"]["samples"] == 60

    got = read_back(out)
    assert sorted(k for s in got.values() for k in s) == sorted(expected)
    for samples in got.values():
        for key, fields in samples.items():
            label = str(["cls0", "cls1", "cls2"].index(key.split("/")[0])).encode()
            assert fields == {**expected[key], "cls": label}

    assert run("verify", out).exit_code == 0
    summary = run("inspect", out, "--json")
    assert summary.exit_code == 0
    assert json.loads(summary.output)["splits"]["val"]["samples"] == manifest["splits"]["val"]["samples"]
    assert "samples/shard" in run("inspect", out).output


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # webdataset leaves files open
def test_tar_shards_read_unchanged_by_webdataset(tmp_path: Path) -> None:
    expected = make_tree(tmp_path / "src", 30)
    assert (
        run("pack", tmp_path / "src", tmp_path / "out", "--format", "tar", "--max-samples", "8").exit_code
        == 0
    )
    urls = sorted(str(p) for p in (tmp_path / "out" / "train").glob("*.tar"))
    assert dict(read_with_webdataset(urls)) == expected


def test_pack_is_reproducible_across_runs_and_worker_counts(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 50)
    for fmt in FORMATS:
        outs = []
        for workers in ("1", "2"):
            out = tmp_path / f"{fmt}-{workers}"
            assert run("pack", tmp_path / "src", out, "--format", fmt, "--max-samples", "9",
                       "--split", "a=0.5,b=0.5", "--workers", workers).exit_code == 0  # fmt: skip
            outs.append(tree_files(out))
        assert outs[0] == outs[1], fmt


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
def test_pack_file_list(tmp_path: Path, kind: str) -> None:
    make_tree(tmp_path / "files", 5, classes=1, fields=("bin",))
    rows = [
        {"key": f"s{i}", "bin": f"files/cls0/{i:05d}.bin", "cls": i % 2, "txt": f"caption {i}"}
        for i in range(5)
    ]
    table = pa.Table.from_pylist(rows)
    path = tmp_path / f"list.{kind}"
    if kind == "csv":
        import pyarrow.csv

        pyarrow.csv.write_csv(table, path)
    elif kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pq.write_table(table, path)
    result = run("pack", path, tmp_path / "out", "--format", "tar", "--literal", "txt")
    assert result.exit_code == 0, result.output
    got = read_back(tmp_path / "out")["train"]
    assert got["s3"] == {
        "bin": (tmp_path / "files/cls0/00003.bin").read_bytes(),
        "cls": b"1",
        "txt": b"caption 3",
    }


def test_adopt_webdataset_and_tfrecord_shards(tmp_path: Path) -> None:
    import webdataset as wds
    from tfrecord.writer import TFRecordWriter

    folder = tmp_path / "wds"
    (folder / "val").mkdir(parents=True)
    for name in ["a.tar", "b.tar", "val/c.tar"]:
        with wds.TarWriter(str(folder / name)) as sink:
            for i in range(4):
                key = f"{Path(name).stem}{i}"
                sink.write({"__key__": key, "txt": f"t{i}".encode(), "cls": str(i).encode()})
    result = run("index", folder)
    assert result.exit_code == 0, result.output
    assert run("verify", folder).exit_code == 0
    got = read_back(folder)
    assert len(got["train"]) == 8 and got["val"]["c2"] == {"txt": b"t2", "cls": b"2"}
    assert run("index", folder).exit_code == 2  # a manifest is there already

    folder = tmp_path / "tfr"
    folder.mkdir()
    writer = TFRecordWriter(str(folder / "x.tfrecord"))
    for i in range(3):
        writer.write({"png": (f"img{i}".encode(), "byte"), "label": (i, "int")})
    writer.close()
    assert run("index", folder).exit_code == 0
    samples = list(read_back(folder)["train"].values())
    assert samples[1] == {"png": b"img1", "label": b"1"}


# ---- bad input: clear message, right exit code, no traceback, nothing partial left -----------------------


def assert_clean_failure(result: Result, code: int, *needles: str) -> None:
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit)  # click handled it: no traceback
    for needle in needles:
        assert needle in result.output, result.output


def final_shards(out: Path) -> list[Path]:
    return [p for p in out.rglob("shard-*") if ".tmp-" not in p.name] if out.exists() else []


def test_missing_and_empty_source(tmp_path: Path) -> None:
    assert_clean_failure(
        run("pack", tmp_path / "nope", tmp_path / "out", "--format", "tar"), 1, "does not exist"
    )
    (tmp_path / "empty").mkdir()
    assert_clean_failure(
        run("pack", tmp_path / "empty", tmp_path / "out", "--format", "tar"), 1, "no samples"
    )
    assert not (tmp_path / "out").exists()


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 4)
    (tmp_path / "src" / "cls0" / "00009.bin").symlink_to(tmp_path / "missing-target")
    assert_clean_failure(run("pack", tmp_path / "src", tmp_path / "out", "--format", "tar"), 1, "00009.bin")
    assert final_shards(tmp_path / "out") == []


def test_file_unreadable_at_write_time_leaves_no_partial_shard(tmp_path: Path) -> None:
    make_tree(tmp_path / "files", 3, classes=1, fields=("bin",))
    (tmp_path / "files" / "dir.bin").mkdir()  # stat works, reading fails
    rows = [{"key": f"s{i}", "bin": f"files/cls0/{i:05d}.bin"} for i in range(3)] + [
        {"key": "s3", "bin": "files/dir.bin"}
    ]
    (tmp_path / "list.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    result = run("pack", tmp_path / "list.jsonl", out, "--format", "tfrecord")
    assert_clean_failure(result, 1, "dir.bin", "'s3'", "train/shard-000000.tfrecord")
    assert final_shards(out) == [] and not list(out.rglob("*.tmp-*"))
    assert not (out / "manifest.json").exists()


def test_incomplete_samples(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 6)
    (tmp_path / "src" / "cls1" / "00004.txt").unlink()
    assert_clean_failure(
        run("pack", tmp_path / "src", tmp_path / "out", "--format", "lmdb"), 1, "cls1/00004", "txt"
    )
    result = run("pack", tmp_path / "src", tmp_path / "out", "--format", "lmdb", "--skip-incomplete")
    assert result.exit_code == 0 and "skipped 1 incomplete" in result.output
    assert load_manifest(tmp_path / "out").splits["train"][0].num_samples == 5


def test_duplicate_keys_in_list(tmp_path: Path) -> None:
    (tmp_path / "list.jsonl").write_text('{"key": "a", "cls": 1}\n{"key": "a", "cls": 2}\n')
    assert_clean_failure(run("pack", tmp_path / "list.jsonl", tmp_path / "out", "--format", "tar"), 1, "'a'")


def test_sample_larger_than_max_bytes(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 3, size=1000)
    result = run("pack", tmp_path / "src", tmp_path / "out", "--format", "tar", "--max-bytes", "1KB")
    assert_clean_failure(result, 1, "--max-bytes")
    assert final_shards(tmp_path / "out") == []


def test_output_holding_a_dataset_needs_overwrite(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 5)
    out = tmp_path / "out"
    assert run("pack", tmp_path / "src", out, "--format", "tar").exit_code == 0
    before = tree_files(out)
    assert_clean_failure(run("pack", tmp_path / "src", out, "--format", "lmdb"), 2, "--overwrite")
    assert tree_files(out) == before
    assert run("pack", tmp_path / "src", out, "--format", "lmdb", "--overwrite").exit_code == 0
    assert load_manifest(out).format == "lmdb" and not list(out.rglob("*.tar"))


def test_malformed_split(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 3)
    result = run(
        "pack", tmp_path / "src", tmp_path / "out", "--format", "tar", "--split", "train=0.7,val=0.2"
    )
    assert_clean_failure(result, 2, "sum to 0.9")


def test_verify_names_corruption(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 20)
    out = tmp_path / "out"
    assert run("pack", tmp_path / "src", out, "--format", "tfrecord", "--max-samples", "10").exit_code == 0
    shard = out / "train" / "shard-000001.tfrecord"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = run("verify", out)
    assert_clean_failure(result, 1, "shard-000001.tfrecord", "sha256")
    shard.write_bytes(bytes(data[: len(data) // 3]))  # truncated
    assert_clean_failure(run("verify", out), 1, "shard-000001.tfrecord")


def test_every_command_has_help() -> None:
    for command in ["pack", "verify", "inspect", "index"]:
        result = run(command, "--help")
        assert result.exit_code == 0 and len(result.output) > 200


# ---- crash safety: kill a real pack process, then resume ------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_killed_pack_resumes_to_identical_output(tmp_path: Path, fmt: str) -> None:
    make_tree(tmp_path / "src", 3000, fields=("bin",), size=2000)
    reference = tmp_path / "reference"
    args = ["--format", fmt, "--max-samples", "20", "--workers", "2", "--quiet"]
    assert run("pack", tmp_path / "src", reference, *args).exit_code == 0

    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "shardpipe", "pack", str(tmp_path / "src"), str(out), *args]
    proc = subprocess.Popen(cmd, start_new_session=True)
    journal = out / ".shardpipe-journal.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.exists() and len(journal.read_text().splitlines()) >= 4:
            break
        time.sleep(0.002)
    assert proc.poll() is None, "pack finished before it could be killed; make the input larger"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.2)  # let orphaned pool workers die on their broken pipe

    assert not (out / "manifest.json").exists()
    expected = tree_files(reference)
    partial = {p.relative_to(out).as_posix() for p in final_shards(out)}
    assert 0 < len(partial) < len(expected) - 1
    for rel in partial:  # whatever sits under a final name is complete
        assert (out / rel).read_bytes() == expected[rel], rel

    result = run("pack", tmp_path / "src", out, "--resume", *args)
    assert result.exit_code == 0, result.output
    assert "resumed: kept" in result.output
    assert run("verify", out).exit_code == 0
    assert tree_files(out) == expected
