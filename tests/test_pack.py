"""The pack stage end to end: formats, manifest, order, reproducibility whoever runs it, crash + resume.

The CLI's own behaviour (help, exit codes, the flags its messages name) is tested in test_cli.py.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from shardpipe.cli import main
from shardpipe.formats import get_format
from shardpipe.formats.layout import ShardIndex
from shardpipe.manifest import Manifest, load_manifest
from shardpipe.packing import PackOptions, output, pack
from shardpipe.packing.options import ORDER_HASH
from shardpipe.packing.output import JobMismatchError
from shardpipe.storage import Store
from tests.datagen import make_tree, read_with_webdataset

FORMATS = ["tar", "lmdb", "tfrecord"]


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def read_shards(out: Path) -> dict[str, list[dict[str, dict[str, bytes]]]]:
    """Every shard of every split in manifest order, read through the format's reader and the indexes."""
    manifest = load_manifest(out)
    fmt = get_format(manifest.format)
    splits: dict[str, list[dict[str, dict[str, bytes]]]] = {}
    for name, shards in manifest.splits.items():
        for shard in shards:
            index = None
            if shard.index_path:
                index = ShardIndex.read(out / shard.index_path, shard.num_samples, manifest.fields)
            splits.setdefault(name, []).append(dict(fmt.read(out / shard.path, 0, shard.num_samples, index)))
    return splits


def read_back(out: Path) -> dict[str, dict[str, dict[str, bytes]]]:
    """Every sample of every split, keyed by sample key (each key once)."""
    splits: dict[str, dict[str, dict[str, bytes]]] = {}
    for name, shards in read_shards(out).items():
        samples = splits.setdefault(name, {})
        for shard in shards:
            assert not samples.keys() & shard.keys()
            samples.update(shard)
    return splits


def tree_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def final_shards(out: Path) -> list[Path]:
    return [p for p in out.rglob("shard-*") if ".tmp-" not in p.name] if out.exists() else []


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
    assert manifest["order"] == {"method": "hashed", "rule": ORDER_HASH, "seed": 3}
    assert manifest["job"]["options"]["max_samples"] == 7 and manifest["job"]["source"] == str(
        tmp_path / "src"
    )
    for split in manifest["splits"].values():
        assert all(s["samples"] <= 7 for s in split["shards"])

    got = read_back(out)
    assert sorted(k for s in got.values() for k in s) == sorted(expected)
    shard_classes = [{key.split("/")[0] for key in shard} for shard in read_shards(out)["train"]]
    assert sum(len(c) > 1 for c in shard_classes) > len(shard_classes) // 2  # hashed order mixes classes
    for samples in got.values():
        for key, fields in samples.items():
            label = str(["cls0", "cls1", "cls2"].index(key.split("/")[0])).encode()
            assert fields == {**expected[key], "cls": label}

    assert run("verify", out).exit_code == 0
    summary = run("inspect", out, "--json")
    assert summary.exit_code == 0
    assert json.loads(summary.output)["splits"]["val"]["samples"] == len(got["val"])
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


def test_pack_is_reproducible_across_runs_worker_counts_and_executors(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 50)
    for fmt in FORMATS:
        outs = []
        for workers in ("1", "2"):
            out = tmp_path / f"{fmt}-{workers}"
            assert run("pack", tmp_path / "src", out, "--format", fmt, "--max-samples", "9",
                       "--split", "a=0.5,b=0.5", "--workers", workers).exit_code == 0  # fmt: skip
            outs.append(tree_files(out))
        options = PackOptions(format=fmt, split={"a": 0.5, "b": 0.5}, max_samples=9)
        with ThreadPoolExecutor(3) as threads:  # another executor: what a cluster engine plugs in
            pack(tmp_path / "src", tmp_path / f"{fmt}-threads", options, quiet=True, executor=threads)
        outs.append(tree_files(tmp_path / f"{fmt}-threads"))
        assert outs[0] == outs[1] == outs[2], fmt
        assert len(outs[0]) > 4  # several shards, so the executors really ran several tasks


class PicklingExecutor(ThreadPoolExecutor):
    """An executor that, like a cluster engine, ships every task and result through pickle."""

    def __init__(self) -> None:
        super().__init__(2)
        self.tasks: list[str] = []

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        assert fn.__qualname__ == fn.__name__, "a task must be a module-level function"
        self.tasks.append(f"{fn.__module__}.{fn.__name__}")
        shipped = pickle.loads(pickle.dumps((fn, args, kwargs)))
        return super().submit(_round_trip, *shipped)


def _round_trip(fn, args, kwargs):  # type: ignore[no-untyped-def]
    return pickle.loads(pickle.dumps(fn(*args, **kwargs)))


def test_an_executor_runs_the_scan_and_the_writes_through_pickle(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 40, classes=4)
    options = PackOptions(format="lmdb", max_samples=6, labels="dirname")
    local = pack(tmp_path / "src", tmp_path / "local", options, quiet=True)
    with PicklingExecutor() as executor:
        shipped = pack(tmp_path / "src", tmp_path / "shipped", options, quiet=True, executor=executor)
    assert (
        executor.tasks.count("shardpipe.sources.tree.scan_names") == 5
    )  # the top folder and 4 class folders
    assert executor.tasks.count("shardpipe.packing.shard_writing.write_shard") == 7
    assert set(executor.tasks) == {
        "shardpipe.sources.tree.scan_names",
        "shardpipe.packing.shard_writing.write_shard",
    }
    assert shipped.manifest == local.manifest
    assert tree_files(tmp_path / "shipped") == tree_files(tmp_path / "local")


def test_order_sorted_keeps_key_order_and_is_recorded(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 40)
    out = tmp_path / "out"
    result = pack(
        tmp_path / "src", out, PackOptions(format="tar", order="sorted", max_samples=10), quiet=True
    )
    assert result.manifest.order["method"] == "sorted" and "seed" not in result.manifest.order
    shards = read_shards(out)["train"]
    keys = [key for shard in shards for key in shard]
    assert keys == sorted(keys)
    assert [len({key.split("/")[0] for key in shard}) for shard in shards] == [1, 2, 2, 1]  # classes in runs
    hashed = pack(
        tmp_path / "src", tmp_path / "hashed", PackOptions(format="tar", max_samples=10), quiet=True
    )
    assert hashed.manifest.job["fingerprint"] != result.manifest.job["fingerprint"]
    hashed_keys = [key for shard in read_shards(tmp_path / "hashed")["train"] for key in shard]
    assert hashed_keys != keys and sorted(hashed_keys) == keys


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


# ---- resume on a finished pack: a no-op for the same job, refused for another ------------------------------


def test_resume_of_a_finished_pack_writes_nothing(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 30)
    out = tmp_path / "out"
    options = PackOptions(format="tfrecord", max_samples=8)
    first = pack(tmp_path / "src", out, options, quiet=True)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    again = pack(
        tmp_path / "src", out, PackOptions(format="tfrecord", max_samples=8, resume=True), quiet=True
    )
    assert again.already_complete and (again.num_written, again.num_reused) == (0, 4)
    assert again.manifest == first.manifest
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_resume_after_a_kill_between_manifest_and_journal_removal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tree(tmp_path / "src", 30)
    out = tmp_path / "out"
    options = PackOptions(format="lmdb", max_samples=8, workers=2)
    reference = pack(tmp_path / "src", tmp_path / "reference", options, quiet=True)

    write_manifest = output.write_manifest

    def killed(store: Store, manifest: Manifest) -> None:
        write_manifest(store, manifest)
        raise KeyboardInterrupt("killed after the manifest write")

    monkeypatch.setattr(output, "write_manifest", killed)
    with pytest.raises(KeyboardInterrupt):
        pack(tmp_path / "src", out, options, quiet=True)
    monkeypatch.undo()
    assert (out / "manifest.json").exists() and (out / output.JOURNAL_NAME).exists()
    result = run("pack", tmp_path / "src", out, "--format", "lmdb", "--max-samples", "8", "--resume", "-q")
    assert result.exit_code == 0, result.output
    assert "already complete: 4 shards" in result.output
    assert tree_files(out) == tree_files(tmp_path / "reference")  # the journal is gone, nothing else moved
    assert load_manifest(out) == reference.manifest


def test_resume_after_a_kill_while_the_journal_was_written(tmp_path: Path) -> None:
    """A pack killed before its journal was published leaves only the journal's temporary: ``--resume``
    starts it afresh, where a pack without ``--resume`` still refuses the non-empty OUT."""
    make_tree(tmp_path / "src", 30)
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{output.JOURNAL_NAME}.tmp-12345").write_bytes(b'{"half a journ')
    args = ["pack", tmp_path / "src", out, "--format", "tar", "--max-samples", "8", "-q"]
    refused = run(*args)
    assert refused.exit_code != 0 and "already holds other files" in refused.output
    result = run(*args, "--resume")
    assert result.exit_code == 0, result.output
    reference = pack(
        tmp_path / "src", tmp_path / "reference", PackOptions(format="tar", max_samples=8), quiet=True
    )
    assert tree_files(out) == tree_files(tmp_path / "reference") and load_manifest(out) == reference.manifest


def test_resume_of_a_finished_pack_of_another_job_is_refused(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 30)
    out = tmp_path / "out"
    pack(tmp_path / "src", out, PackOptions(format="tar", max_samples=8), quiet=True)
    before = tree_files(out)
    with pytest.raises(JobMismatchError) as caught:
        pack(tmp_path / "src", out, PackOptions(format="tar", max_samples=8, seed=2, resume=True), quiet=True)
    assert caught.value.differences == ("seed: found 0, expected 2",)
    (tmp_path / "src" / "cls0" / "00000.bin").write_bytes(b"resized")
    with pytest.raises(JobMismatchError, match="content changed"):
        pack(tmp_path / "src", out, PackOptions(format="tar", max_samples=8, resume=True), quiet=True)
    assert tree_files(out) == before
