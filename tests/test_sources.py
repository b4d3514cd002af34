"""Scanning a tree: the pool's chunked scan equals the serial one, and follows os.walk's selection."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from shardpipe.errors import DataError, UsageError
from shardpipe.sources import IncompleteSamplesError, Scan, scan_source, tree
from tests.datagen import make_tree


def _tree(root: Path) -> dict[str, dict[str, bytes]]:
    """Nested folders, hidden names, files without an extension, and symlinks to a file and a folder."""
    expected = make_tree(root / "top", 23, classes=2)
    deep = make_tree(root / "top" / "cls0" / "deeper", 4, classes=1)
    expected.update({f"cls0/deeper/{key}": fields for key, fields in deep.items()})
    (root / "top" / ".hidden.bin").write_bytes(b"x")
    (root / "top" / ".cache").mkdir()
    (root / "top" / ".cache" / "k.bin").write_bytes(b"x")
    (root / "top" / "README").write_text("no extension: ignored")
    (root / "top" / "cls1" / "LICENSE").write_text("no extension: ignored")
    os.symlink(root / "top" / "cls0" / "00000.bin", root / "top" / "linked.bin")  # read as its target
    os.symlink(root / "top" / "cls1", root / "top" / "linked-folder")  # not entered, like os.walk
    expected["linked"] = {"bin": expected["cls0/00000"]["bin"]}
    return expected


def _as_dict(scan: Scan) -> dict[str, dict[str, tuple[str | bytes, int]]]:
    table = scan.table
    return {
        key: {name: (table.columns[j][i], int(table.sizes[i, j])) for j, name in enumerate(table.fields)}
        for i, key in enumerate(table.keys)
    }


def test_pool_scan_equals_serial_scan_and_walks_like_os_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _tree(tmp_path)
    monkeypatch.setattr(tree, "_CHUNK", 5)  # folders split over several tasks
    serial = scan_source(tmp_path / "top", skip_incomplete=True)
    with ProcessPoolExecutor(2) as pool:
        pooled = scan_source(tmp_path / "top", skip_incomplete=True, pool=pool)
    assert _as_dict(pooled) == _as_dict(serial)
    assert pooled.table.keys == sorted(pooled.table.keys) == serial.table.keys
    assert (pooled.num_ignored_files, serial.num_ignored_files) == (2, 2)
    assert pooled.num_skipped_incomplete == serial.num_skipped_incomplete == 1  # linked.bin has no txt
    complete = {key: fields for key, fields in expected.items() if len(fields) == 2}
    assert set(serial.table.keys) == set(complete)
    for i, key in enumerate(serial.table.keys):
        for j, name in enumerate(serial.table.fields):
            path = serial.table.columns[j][i]
            assert isinstance(path, str) and Path(path).read_bytes() == complete[key][name]
            assert serial.table.sizes[i, j] == len(complete[key][name])


def test_dirname_labels_and_table_rows(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 7, classes=3, fields=("bin",))
    scan = scan_source(tmp_path / "src", labels="dirname")
    assert scan.classes == ("cls0", "cls1", "cls2") and scan.table.fields == ("bin", "cls")
    labels = dict(zip(scan.table.keys, scan.table.columns[1], strict=True))
    assert labels["cls2/00005"] == b"2" and labels["cls0/00006"] == b"0"
    picked = scan.table.take([1, 4])
    assert picked.keys == [scan.table.keys[1], scan.table.keys[4]]
    assert picked.columns[1] == [scan.table.columns[1][1], scan.table.columns[1][4]]
    np.testing.assert_array_equal(picked.sizes, scan.table.sizes[[1, 4]])


def test_broken_symlink_is_named(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 3)
    (tmp_path / "src" / "cls0" / "gone.bin").symlink_to(tmp_path / "nowhere")
    with pytest.raises(DataError, match=r"cls0/gone\.bin"):
        scan_source(tmp_path / "src")


def test_incomplete_samples_are_an_error_unless_skipped(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 6)
    (tmp_path / "src" / "cls1" / "00004.txt").unlink()
    with pytest.raises(IncompleteSamplesError, match=r"1 sample\(s\).*'cls1/00004' has no txt"):
        scan_source(tmp_path / "src")
    scan = scan_source(tmp_path / "src", skip_incomplete=True)
    assert scan.num_skipped_incomplete == 1 and "cls1/00004" not in scan.table.keys
    assert scan.table.num_bytes.tolist() == [200 + 2 * (int(key[-5:]) % 7) for key in scan.table.keys]


def test_file_list_rows_become_samples(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"abc")
    rows = [
        '{"key": "s1", "bin": "a.bin", "cls": 3, "ok": true, "txt": "hi"}',
        '{"key": "s0", "bin": "a.bin", "cls": 1, "ok": false, "txt": "yo"}',
    ]
    (tmp_path / "list.jsonl").write_text("\n".join(rows) + "\n")
    scan = scan_source(tmp_path / "list.jsonl", literal_fields=("txt",))
    table = scan.table
    assert table.keys == ["s0", "s1"] and table.fields == ("bin", "cls", "ok", "txt")
    assert [column[0] for column in table.columns] == [str(tmp_path / "a.bin"), b"1", b"0", b"yo"]
    assert table.sizes[0].tolist() == [3, 1, 1, 2]
    with pytest.raises(UsageError, match="caption"):
        scan_source(tmp_path / "list.jsonl", literal_fields=("caption",))
    with pytest.raises(UsageError, match="labels apply to a directory tree"):
        scan_source(tmp_path / "list.jsonl", labels="dirname")
