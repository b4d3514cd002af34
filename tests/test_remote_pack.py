"""pack, verify, inspect and index against the loopback S3 and HTTP servers: the same bytes as local.

A dataset packed to S3 is downloaded and compared with the same pack written locally, byte for byte
(manifest included: the source is the same local folder). A killed pack resumes against the bucket.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from shardpipe.cli import main
from shardpipe.errors import DataError
from shardpipe.manifest import load_manifest
from shardpipe.packing import PackOptions, pack, pack_source
from shardpipe.packing.output import JOURNAL_NAME
from shardpipe.storage import Store, open_store
from testkit.servers import Faults, S3Server
from tests.datagen import make_tree
from tests.test_pack import PicklingExecutor


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def cli_options(s3: S3Server) -> list[str]:
    """The S3 server's storage options as ``--storage-option`` flags."""
    options = s3.storage_options()
    return [
        "--storage-option", f"endpoint_url={options['endpoint_url']}",
        "--storage-option", f"key={options['key']}",
        "--storage-option", f"secret={options['secret']}",
        "--storage-option", "client_kwargs.region_name=us-east-1",
    ]  # fmt: skip


def tree_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def store_files(store: Store) -> dict[str, bytes]:
    return {key: store.read(key) for key in store.list_keys()}


def upload_tree(root: Path, store: Store) -> None:
    for rel, data in tree_files(root).items():
        store.put(rel, data)


def test_pack_to_s3_then_verify_and_inspect_equal_the_local_pack(
    tmp_path: Path, s3: S3Server, s3_root: str
) -> None:
    make_tree(tmp_path / "src", 60, classes=3)
    args = ["--format", "tar", "--max-samples", "10", "--split", "train=0.8,val=0.2", "-q"]
    assert run("pack", tmp_path / "src", tmp_path / "local", *args).exit_code == 0
    result = run("pack", tmp_path / "src", s3_root, *args, *cli_options(s3))
    assert result.exit_code == 0, result.output
    assert f"manifest: {s3_root}/manifest.json" in result.output
    store = open_store(s3_root, storage_options=s3.storage_options())
    assert store_files(store) == tree_files(tmp_path / "local")  # manifest too; no journal left
    verified = run("verify", s3_root, "-q", *cli_options(s3))
    assert verified.exit_code == 0 and f"{s3_root}: OK" in verified.output, verified.output
    remote = run("inspect", s3_root, "--json", *cli_options(s3))
    assert remote.exit_code == 0, remote.output
    assert json.loads(remote.output) == json.loads(run("inspect", tmp_path / "local", "--json").output)
    assert load_manifest(f"{s3_root}/manifest.json", s3.storage_options()) == load_manifest(
        tmp_path / "local"
    )

    puts = s3.control.count("PUT", "")
    again = run("pack", tmp_path / "src", s3_root, *args, "--resume", *cli_options(s3))
    assert again.exit_code == 0 and "already complete: 7 shards" in again.output, again.output
    assert s3.control.count("PUT", "") == puts, "a resume of a finished pack wrote to the bucket"
    refused = run("pack", tmp_path / "src", s3_root, *args, *cli_options(s3))
    assert refused.exit_code == 2 and "already holds a shardpipe dataset" in refused.output
    store.put("notes.txt", b"mine")
    store.put("train/shard-000099.tar", b"stale")
    replaced = run("pack", tmp_path / "src", s3_root, *args, "--overwrite", *cli_options(s3))
    assert replaced.exit_code == 0, replaced.output
    files = store_files(store)
    assert files.pop("notes.txt") == b"mine" and files == tree_files(tmp_path / "local")


def test_verify_and_inspect_a_manifest_url_over_https_style_http(
    tmp_path: Path, http_dir: tuple[Path, str]
) -> None:
    folder, url = http_dir
    make_tree(tmp_path / "src", 30)
    assert run("pack", tmp_path / "src", folder / "data", "--format", "tfrecord", "--max-samples", "8", "-q")
    assert run("verify", f"{url}/data/manifest.json", "-q").output.strip() == f"{url}/data/manifest.json: OK"
    shown = run("inspect", f"{url}/data/manifest.json")
    assert shown.exit_code == 0 and "train" in shown.output
    refused = run("pack", tmp_path / "src", f"{url}/out", "--format", "tar")
    assert refused.exit_code == 2 and "http(s) has no standard upload" in refused.output
    missing = run("inspect", f"{url}/nothing/manifest.json")
    assert missing.exit_code == 1 and f"no manifest at {url}/nothing/manifest.json" in missing.output


def test_verify_finds_a_corrupted_object(tmp_path: Path, s3: S3Server, s3_root: str) -> None:
    make_tree(tmp_path / "src", 30)
    options = s3.storage_options()
    opts = PackOptions(format="tar", max_samples=10)
    with PicklingExecutor() as executor:  # the upload task and its store travel through pickle
        pack(tmp_path / "src", s3_root, opts, quiet=True, storage_options=options, executor=executor)
    assert executor.tasks.count("shardpipe.packing.shard_writing.write_shard") == 3
    store = open_store(s3_root, storage_options=options)
    data = bytearray(store.read("train/shard-000001.tar"))
    data[700] ^= 0xFF
    store.put("train/shard-000001.tar", bytes(data))
    store.remove("train/shard-000002.tar.idx")
    result = run("verify", s3_root, "-q", *cli_options(s3))
    assert result.exit_code == 1
    assert "train/shard-000001.tar: sha256 differs from the manifest" in result.output
    assert "train/shard-000002.tar.idx: missing" in result.output
    assert "train/shard-000000" not in result.output


def test_killed_pack_to_s3_resumes_against_the_bucket(tmp_path: Path, s3: S3Server, s3_root: str) -> None:
    make_tree(tmp_path / "src", 1200, fields=("bin",), size=500)
    args = ["--format", "tar", "--max-samples", "20", "--workers", "2", "--quiet"]
    assert run("pack", tmp_path / "src", tmp_path / "reference", *args).exit_code == 0
    expected = tree_files(tmp_path / "reference")
    store = open_store(s3_root, storage_options=s3.storage_options())

    cmd = [sys.executable, "-m", "shardpipe", "pack", str(tmp_path / "src"), s3_root, *args, *cli_options(s3)]
    proc = subprocess.Popen(cmd, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if store.exists(JOURNAL_NAME) and len(store.read(JOURNAL_NAME).splitlines()) >= 4:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "pack finished before it could be killed; make the input larger"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

    found = store_files(store)
    assert "manifest.json" not in found and JOURNAL_NAME in found
    shards = {key for key in found if key.startswith("train/")}
    assert 0 < len(shards) < len(expected) - 1
    for key in shards:  # whatever sits under a final name is complete
        assert found[key] == expected[key], key
    journaled = [json.loads(line)["path"] for line in found[JOURNAL_NAME].splitlines()[1:]]
    store.remove(journaled[0])  # a journaled shard gone from the bucket: the resume writes it again

    result = run("pack", tmp_path / "src", s3_root, "--resume", *args, *cli_options(s3))
    assert result.exit_code == 0, result.output
    assert f"resumed: kept {len(journaled) - 1} finished shard(s)" in result.output
    assert store_files(store) == expected


def test_missing_remote_sources_fail_naming_the_url(tmp_path: Path, s3: S3Server, s3_root: str) -> None:
    missing_list = run(
        "pack", f"{s3_root}/lists/none.csv", tmp_path / "out", "--format", "tar", *cli_options(s3)
    )
    assert missing_list.exit_code == 1
    assert f"{s3_root}/lists/none.csv: no such object (404)" in missing_list.output
    empty = run("pack", f"{s3_root}/nothing", tmp_path / "out", "--format", "tar", *cli_options(s3))
    assert empty.exit_code == 1 and f"source {s3_root}/nothing holds no samples" in empty.output
    store = open_store(s3_root, storage_options=s3.storage_options())
    store.put("list.csv", b"key,bin\na,gone.bin\n")
    gone = run("pack", f"{s3_root}/list.csv", tmp_path / "out", "--format", "tar", *cli_options(s3))
    assert gone.exit_code == 1
    assert f"row 1 (a), field 'bin': stat {s3_root}/gone.bin: no such object (404)" in gone.output


def test_remote_prefix_and_url_file_lists_pack_to_the_local_bytes(
    tmp_path: Path, s3: S3Server, s3_root: str, http_dir: tuple[Path, str]
) -> None:
    options = s3.storage_options()
    make_tree(tmp_path / "src", 40, classes=4)
    local = pack(
        tmp_path / "src",
        tmp_path / "local",
        PackOptions(format="tfrecord", max_samples=7, labels="dirname"),
        quiet=True,
    )
    src_url = f"{s3_root}-src"
    upload_tree(tmp_path / "src", open_store(src_url, storage_options=options))
    shipped = PackOptions(format="tfrecord", max_samples=7, labels="dirname", workers=2)
    remote = pack(src_url, tmp_path / "from-s3", shipped, quiet=True, storage_options=options)
    shards = {k: v for k, v in tree_files(tmp_path / "local").items() if k != "manifest.json"}
    assert {k: v for k, v in tree_files(tmp_path / "from-s3").items() if k != "manifest.json"} == shards
    assert (
        remote.manifest.splits == local.manifest.splits and remote.manifest.classes == local.manifest.classes
    )
    assert remote.manifest.source == {"kind": "tree", "path": src_url, "labels": "dirname"}

    # a file list: cells that are HTTP URLs, and a list in S3 whose relative cells are keys beside it
    folder, url = http_dir
    files = tree_files(tmp_path / "src")
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    keys = sorted({rel.rsplit(".", 1)[0] for rel in files})
    rows = ["key,bin,txt", *(f"{k},{url}/{k}.bin,{url}/{k}.txt" for k in keys)]
    (tmp_path / "urls.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "paths.csv").write_text(
        "\n".join(["key,bin,txt", *(f"{k},src/{k}.bin,src/{k}.txt" for k in keys)]) + "\n"
    )
    open_store(src_url, storage_options=options).put(
        "list.csv", (tmp_path / "paths.csv").read_bytes().replace(b",src/", b",")
    )
    opts = PackOptions(format="tar", max_samples=9)
    pack(tmp_path / "paths.csv", tmp_path / "list-local", opts, quiet=True)
    pack(tmp_path / "urls.csv", tmp_path / "list-http", opts, quiet=True)
    pack(f"{src_url}/list.csv", s3_root, opts, quiet=True, storage_options=options)
    reference = {k: v for k, v in tree_files(tmp_path / "list-local").items() if k != "manifest.json"}
    assert {k: v for k, v in tree_files(tmp_path / "list-http").items() if k != "manifest.json"} == reference
    in_s3 = store_files(open_store(s3_root, storage_options=options))
    assert {k: v for k, v in in_s3.items() if k != "manifest.json"} == reference
    assert json.loads(in_s3["manifest.json"])["source"]["kind"] == "list"


def test_index_adopts_tars_in_a_bucket(tmp_path: Path, s3: S3Server, s3_root: str) -> None:
    make_tree(tmp_path / "src", 30)
    pack(tmp_path / "src", tmp_path / "packed", PackOptions(format="tar", max_samples=10), quiet=True)
    foreign = tmp_path / "foreign"
    for tar in sorted((tmp_path / "packed/train").glob("*.tar")):
        (foreign / "train").mkdir(parents=True, exist_ok=True)
        (foreign / "train" / tar.name).write_bytes(tar.read_bytes())
    store = open_store(s3_root, storage_options=s3.storage_options())
    upload_tree(foreign, store)
    assert run("index", foreign, "-q").exit_code == 0
    result = run("index", s3_root, "-q", *cli_options(s3))
    assert result.exit_code == 0, result.output
    adopted = store_files(store)
    local = tree_files(foreign)
    assert {k: v for k, v in adopted.items() if k != "manifest.json"} == {
        k: v for k, v in local.items() if k != "manifest.json"
    }
    assert load_manifest(s3_root, s3.storage_options()).splits == load_manifest(foreign).splits
    assert run("verify", s3_root, "-q", *cli_options(s3)).exit_code == 0
    again = run("index", s3_root, "-q", *cli_options(s3))
    assert again.exit_code == 2 and "--overwrite" in again.output


def test_a_tenth_of_requests_failing_still_packs_the_same_bytes(
    tmp_path: Path, s3: S3Server, s3_root: str
) -> None:
    make_tree(tmp_path / "src", 40)
    opts = PackOptions(format="tar", max_samples=8)
    pack(tmp_path / "src", tmp_path / "local", opts, quiet=True)
    s3.control.set_faults(Faults(rate=0.1, seed=3, slow_s=0.05))
    pack(tmp_path / "src", s3_root, opts, quiet=True, storage_options=s3.storage_options())
    injected = s3.control.injected
    s3.control.set_faults(Faults())
    assert injected >= 3, "the fault switch injected fewer faults than the test relies on"
    assert store_files(open_store(s3_root, storage_options=s3.storage_options())) == tree_files(
        tmp_path / "local"
    )


SECRET = "fAkE-sEcReT-7d1e0c"


def test_no_secret_reaches_output_logs_journal_or_manifest(
    tmp_path: Path,
    s3: S3Server,
    s3_root: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    make_tree(tmp_path / "src", 30)
    flags = [f.replace("testing-secret-value", SECRET) for f in cli_options(s3)]
    flags += ["--storage-option", f"token={SECRET}"]  # moto checks neither
    store = open_store(s3_root, storage_options={**s3.storage_options(), "secret": SECRET})
    args = ["--format", "tar", "--max-samples", "5"]
    outputs = []
    original = pack_source.write_shard

    def fail_on_third(job, *rest):  # type: ignore[no-untyped-def]
        if job.relpath.endswith("000003.tar"):
            raise DataError(f"injected failure near {s3_root}, options {SECRET}")
        return original(job, *rest)

    monkeypatch.setattr(pack_source, "write_shard", fail_on_third)
    failed = run(
        "pack", tmp_path / "src", s3_root, *args, "--workers", "1", *flags
    )  # the patch is in-process
    assert failed.exit_code == 1 and "options ***" in failed.output, failed.output
    journal = store.read(JOURNAL_NAME).decode()
    assert len(journal.splitlines()) >= 2
    monkeypatch.undo()
    outputs += [failed.output, journal]
    for command in (
        ["pack", tmp_path / "src", s3_root, *args, "--resume", *flags],
        ["verify", s3_root, *flags],
        ["inspect", s3_root, "--json", *flags],
        ["inspect", f"{s3_root}/forbidden", *flags],
        ["pack", tmp_path / "src", f"{s3_root}/forbidden/out", *args, *flags],
        ["verify", f"{s3_root}/nothing", *flags],
    ):
        outputs.append(run(*command).output)
    assert "access denied (403)" in outputs[-2] and "check the credentials" in outputs[-2]
    assert "no manifest at" in outputs[-1]
    outputs += [data.decode("latin-1") for data in store_files(store).values()]
    outputs.append(caplog.text)
    for text in outputs:
        assert SECRET not in text and "testing-key-id" not in text


def test_file_urls_are_local_paths(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 12)
    assert run("pack", tmp_path / "src", tmp_path / "local", "--format", "lmdb", "-q").exit_code == 0
    result = run("pack", f"file://{tmp_path}/src", f"file://{tmp_path}/url", "--format", "lmdb", "-q")
    assert result.exit_code == 0, result.output
    assert tree_files(tmp_path / "url") == tree_files(tmp_path / "local")
    assert run("verify", f"file://{tmp_path}/url", "-q").exit_code == 0
    assert load_manifest(f"file://{tmp_path}/url") == load_manifest(tmp_path / "local")


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_remote_jsonl_and_parquet_lists(tmp_path: Path, s3: S3Server, s3_root: str, kind: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    options = s3.storage_options()
    store = open_store(s3_root, storage_options=options)
    keys = [f"k{i:02d}" for i in range(12)]
    for key in keys:
        (tmp_path / "files").mkdir(exist_ok=True)
        (tmp_path / "files" / f"{key}.bin").write_bytes(key.encode() * 50)
        store.put(f"files/{key}.bin", key.encode() * 50)
    rows = [{"key": k, "bin": f"files/{k}.bin", "label": i % 3} for i, k in enumerate(keys)]
    if kind == "jsonl":
        data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    else:
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(rows), sink)
        data = sink.getvalue().to_pybytes()
    (tmp_path / f"list.{kind}").write_bytes(data)
    store.put(f"list.{kind}", data)
    opts = PackOptions(format="tfrecord", max_samples=5)
    local = pack(tmp_path / f"list.{kind}", tmp_path / "local", opts, quiet=True)
    remote = pack(f"{s3_root}/list.{kind}", tmp_path / "remote", opts, quiet=True, storage_options=options)
    assert remote.manifest.splits == local.manifest.splits
    assert remote.manifest.source["path"] == f"{s3_root}/list.{kind}"
