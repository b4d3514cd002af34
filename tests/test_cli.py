"""The ``shardpipe`` command: help, exit codes (1 data, 2 usage), the flags its messages name, no traceback.

The library's errors speak in library terms; these tests check that the CLI adds the flags that fix them,
and that nothing partial is left behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from shardpipe.cli import main
from shardpipe.manifest import load_manifest
from tests.datagen import make_tree


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def tree_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_command_has_help_that_explains_it_and_each_option() -> None:
    assert set(main.commands) == {"pack", "verify", "inspect", "index", "get"}
    top = run("--help")
    assert top.exit_code == 0 and all(name in top.output for name in main.commands)
    for name, command in main.commands.items():
        result = run(name, "--help")
        assert result.exit_code == 0, name
        text = " ".join(result.output.split())  # as wrapped for the terminal, joined again
        assert text.startswith(f"Usage: main {name} ")
        assert command.help and len(command.help) > 60 and command.help.split("\n")[0] in text
        for param in command.params:
            if isinstance(param, click.Option) and param.name != "help":
                assert param.help and len(param.help) > 10, f"{name} {param.opts[0]} has no help"
                assert param.opts[-1] in text and " ".join(param.help.split()[:4]) in text


def test_pack_help_documents_order_and_resume() -> None:
    text = " ".join(run("pack", "--help").output.split())
    assert "--order [hashed|sorted]" in text and "default: hashed" in text and "mix classes" in text
    assert "--resume" in text and "do nothing" in text


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
    assert_clean_failure(result, 1, "dir.bin", "'s3'", "train/shard-000000.tfrecord", "rerun with --resume")
    assert final_shards(out) == [] and not list(out.rglob("*.tmp-*"))
    assert not (out / "manifest.json").exists()


def test_incomplete_samples(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 6)
    (tmp_path / "src" / "cls1" / "00004.txt").unlink()
    assert_clean_failure(
        run("pack", tmp_path / "src", tmp_path / "out", "--format", "lmdb"),
        1,
        "cls1/00004",
        "txt",
        "--skip-incomplete",
    )
    result = run("pack", tmp_path / "src", tmp_path / "out", "--format", "lmdb", "--skip-incomplete")
    assert result.exit_code == 0 and "skipped 1 incomplete" in result.output
    assert load_manifest(tmp_path / "out").splits["train"][0].num_samples == 5


def test_duplicate_keys_in_list(tmp_path: Path) -> None:
    (tmp_path / "list.jsonl").write_text('{"key": "a", "cls": 1}\n{"key": "a", "cls": 2}\n')
    assert_clean_failure(run("pack", tmp_path / "list.jsonl", tmp_path / "out", "--format", "tar"), 1, "'a'")


def test_output_holding_a_dataset_needs_overwrite(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 5)
    out = tmp_path / "out"
    assert run("pack", tmp_path / "src", out, "--format", "tar").exit_code == 0
    before = tree_files(out)
    assert_clean_failure(
        run("pack", tmp_path / "src", out, "--format", "lmdb"),
        2,
        "holds a shardpipe dataset",
        "--overwrite",
        "--resume",
    )
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


def test_sample_larger_than_max_bytes_names_the_flag(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 3, size=1000)
    result = run("pack", tmp_path / "src", tmp_path / "out", "--format", "tar", "--max-bytes", "1KB")
    assert_clean_failure(result, 1, "max_bytes=1,000", "raise --max-bytes")
    assert final_shards(tmp_path / "out") == []


def test_resume_and_overwrite_contradict(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 3)
    result = run("pack", tmp_path / "src", tmp_path / "out", "--format", "tar", "--resume", "--overwrite")
    assert_clean_failure(result, 2, "--resume and --overwrite contradict")
    assert not (tmp_path / "out").exists()


def test_resume_of_a_finished_pack_is_a_no_op_and_another_job_is_refused(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 20)
    out = tmp_path / "out"
    args = ["pack", tmp_path / "src", out, "--format", "tar", "--max-samples", "7"]
    assert run(*args).exit_code == 0
    before = tree_files(out)
    result = run(*args, "--resume")
    assert result.exit_code == 0, result.output
    assert "\nalready complete: 3 shards" in result.output  # after the scan's phase lines
    assert tree_files(out) == before
    result = run(*args[:-1], "9", "--resume", "--order", "sorted")
    assert_clean_failure(
        result,
        2,
        "max_samples: found 7, expected 9",
        "order: found 'hashed', expected 'sorted'",
        "--overwrite",
    )
    assert tree_files(out) == before


def test_file_changed_after_the_scan_is_named_with_overwrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardpipe.packing import shard_writing

    make_tree(tmp_path / "src", 4)
    original = shard_writing.write_shard

    def grow_then_write(job, out, format_name, source_options):  # type: ignore[no-untyped-def]
        with (tmp_path / "src" / "cls1" / "00001.txt").open("ab") as grown:
            grown.write(b"more")
        return original(job, out, format_name, source_options)

    monkeypatch.setattr("shardpipe.packing.pack_source.write_shard", grow_then_write)
    result = run("pack", tmp_path / "src", tmp_path / "out", "--format", "tar", "--workers", "1")
    assert_clean_failure(result, 1, "changed while packing", "rerun the pack with --overwrite")
