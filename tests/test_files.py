"""Crash-safe placement: a final name only ever holds complete content; leftovers are swept."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardpipe.storage.files import (
    TEMP_MARK,
    publish,
    start_writeback,
    sweep_temporaries,
    temp_path,
    write_bytes_atomic,
)


def test_write_bytes_atomic_replaces_whole_content_and_leaves_no_temporary(tmp_path: Path) -> None:
    final = tmp_path / "manifest.json"
    write_bytes_atomic(final, b"first")
    write_bytes_atomic(final, b"second")
    assert final.read_bytes() == b"second"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_publish_moves_the_temporary_into_place(tmp_path: Path) -> None:
    final = tmp_path / "shard.tar"
    temp = temp_path(final)
    assert TEMP_MARK in temp.name and temp.parent == tmp_path
    temp.write_bytes(b"data")
    publish(temp, final)
    assert final.read_bytes() == b"data" and not temp.exists()


def test_sweep_removes_only_temporaries(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    temp_path(tmp_path / "train" / "shard-000001.tar").write_bytes(b"partial")
    (tmp_path / "train" / "shard-000000.tar").write_bytes(b"done")
    assert sweep_temporaries(tmp_path) == 1
    assert [p.name for p in (tmp_path / "train").iterdir()] == ["shard-000000.tar"]


def test_start_writeback_leaves_content_alone(tmp_path: Path) -> None:
    path = tmp_path / "shard"
    path.write_bytes(b"x" * 100_000)
    start_writeback(path)
    assert path.read_bytes() == b"x" * 100_000
    with pytest.raises(FileNotFoundError):
        start_writeback(tmp_path / "missing")
