"""File lists read in pieces: the line rule, the same samples for any cutting, global rows in errors."""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardpipe.errors import DataError, UsageError
from shardpipe.packing import PackOptions, pack
from shardpipe.sources import Grouped, IncompleteSamplesError, file_list, line_pieces
from shardpipe.sources.file_list import group_runs, scan_file_list
from shardpipe.sources.line_pieces import cut_ranges, first_line, owned_lines
from shardpipe.sources.list_piece import read_list_piece
from shardpipe.storage import open_store
from testkit.servers import S3Server

pytestmark = pytest.mark.timeout(120)

LINE = st.text(alphabet="ab,\r", max_size=6).filter(lambda s: not s.endswith("\r"))


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(st.tuples(LINE, st.sampled_from(["\n", "\r\n"])), max_size=8),
    trailing=st.booleans(),
    cuts=st.lists(st.integers(0, 60), max_size=6),
    scan=st.integers(1, 5),
)
def test_every_line_belongs_to_exactly_one_piece(
    lines: list[tuple[str, str]], trailing: bool, cuts: list[int], scan: int
) -> None:
    """Whatever the cut points (on a line start, inside a CRLF pair, inside an unterminated last line),
    the pieces' lines, concatenated, are the file's lines, each once and whole."""
    text = "".join(body + end for body, end in lines)
    if lines and not trailing:
        text = text[: -len(lines[-1][1])] if lines[-1][0] else text  # last line without its newline
    data = text.encode()
    size = len(data)
    bounds = sorted({0, size, *(cut for cut in cuts if cut <= size)})
    pieces = list(pairwise(bounds)) or [(0, 0)]
    with mock.patch.object(line_pieces, "_SCAN", scan):  # small reads: the search for a line end loops
        owned = [owned_lines(lambda a, b: data[a:b], size, start, stop) for start, stop in pieces]
    assert b"".join(owned) == data
    position = 0
    for part in owned:
        assert position == 0 or data[position - 1 : position] == b"\n" or not part  # starts a line
        position += len(part)
        assert not part or part.endswith(b"\n") or position == size  # ends one
    assert first_line(lambda a, b: data[a:b], size) == data.split(b"\n", 1)[0] + (
        b"\n" if b"\n" in data else b""
    )


def test_cut_ranges_and_group_runs() -> None:
    assert cut_ranges(0, 4) == [(0, 0)]
    assert cut_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert group_runs([], 10) == [(0, 0)]
    assert group_runs([4, 4, 4, 20, 1], 10) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    with pytest.raises(UsageError, match="piece_bytes must be at least 1, got 0"):
        cut_ranges(5, 0)


def _rows(n: int) -> list[dict[str, object]]:
    """Paths, numbers, booleans, a literal text column with empty runs, and missing cells."""
    return [
        {
            "key": f"s{i:03d}",
            "bin": f"files/{i % 5}.bin" if i % 7 else None,
            "cls": i % 3,
            "ok": i % 2 == 0,
            "txt": "" if 10 <= i < 20 else f"caption {i}",
        }
        for i in range(n)
    ]


def _write(folder: Path, kind: str, rows: list[dict[str, object]], crlf: bool = False) -> Path:
    (folder / "files").mkdir(parents=True, exist_ok=True)
    for i in range(5):
        (folder / "files" / f"{i}.bin").write_bytes(b"x" * (10 + i))
    path = folder / f"list.{kind}"
    table = pa.Table.from_pylist(rows)
    if kind == "csv":
        import pyarrow.csv

        pyarrow.csv.write_csv(table, path)
        if crlf:
            path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    elif kind == "jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        pq.write_table(table, path, row_group_size=3)
    return path


def _scan(
    path: Path | str, piece_bytes: int, literal: tuple[str, ...] = ("txt",), **kwargs: object
) -> Grouped:
    with mock.patch.object(file_list, "PIECE_BYTES", piece_bytes):
        return scan_file_list(path, literal_fields=literal, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["csv", "csv-crlf", "jsonl", "parquet"])
def test_many_pieces_give_the_samples_of_one(tmp_path: Path, kind: str) -> None:
    path = _write(tmp_path, kind.split("-")[0], _rows(40), crlf=kind.endswith("crlf"))
    whole = _scan(path, 1 << 30)
    assert whole["txt"]["s012"] == (b"", 0)  # an empty string is a value
    assert "s007" not in whole["bin"]  # a missing cell (in a CSV: an empty one) is no field
    assert whole["bin"]["s001"] == (str(tmp_path / "files/1.bin"), 11)
    for piece_bytes in (1, 7, 50, 333):
        assert _scan(path, piece_bytes) == whole, piece_bytes
    with ProcessPoolExecutor(2) as pool:
        assert _scan(path, 7, pool=pool) == whole


def test_pieces_whose_types_disagree_are_read_again_whole(tmp_path: Path) -> None:
    """A column of integers in one piece and decimals in another is the whole file's decimals."""
    rows = [{"key": f"k{i}", "score": "2.5" if i == 9 else str(i)} for i in range(10)]
    path = tmp_path / "list.csv"
    path.write_text("key,score\n" + "".join(f"{r['key']},{r['score']}\n" for r in rows))
    calls: list[bool] = []

    def spy(source: object, piece: tuple[int, int], whole: bool = False) -> object:
        calls.append(whole)
        return read_list_piece(source, piece, whole)  # type: ignore[arg-type]

    with mock.patch.object(file_list, "read_list_piece", spy):
        pieced = _scan(path, 5, ())
    assert calls[-1] is True and calls.count(True) == 1 and len(calls) > 2  # pieces, then one whole read
    assert pieced == _scan(path, 1 << 30, ())
    assert pieced["score"]["k1"] == (b"1.0", 3)


def _bad_list(tmp_path: Path, kind: str, bad: Mapping[str, object]) -> Path:
    rows: list[dict[str, object]] = [{"key": f"k{i}", "bin": "files/1.bin"} for i in range(8)]
    rows[6] = dict(bad)
    return _write(tmp_path, kind, rows)


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
def test_errors_name_the_global_row(tmp_path: Path, kind: str) -> None:
    cases = [
        ({"key": "k6", "bin": "files/gone.bin"}, r"row 7 \(k6\), field 'bin': cannot read .*gone\.bin"),
        ({"key": "k2", "bin": "files/1.bin"}, r"row 7: key 'k2' appears more than once; keys must be unique"),
        ({"key": "", "bin": "files/1.bin"}, r"row 7: 'key' must be a non-empty string, got (''|None)"),
    ]
    for bad, message in cases:
        path = _bad_list(tmp_path, kind, bad)
        for piece_bytes in (1, 1 << 30):
            with pytest.raises(DataError, match=message):
                _scan(path, piece_bytes, ())


def test_list_wide_checks_come_before_row_errors(tmp_path: Path) -> None:
    path = tmp_path / "list.jsonl"
    path.write_text('{"name": "a", "bin": "gone"}\n' * 3)
    with pytest.raises(DataError, match=r"has no 'key' column \(found: name, bin\)"):
        _scan(path, 1)
    path.write_text('{"key": "a", "cls": 2}\n{"bin": "x"}\n{"key": "c", "cls": 1}\n')  # row 2 has no key
    with pytest.raises(DataError, match=r"row 2: 'key' must be a non-empty string, got None"):
        _scan(path, 1, ())
    path.write_text('{"key": "a", "cls": 1}\n{"key": "b", "cls": 2}\n')
    with pytest.raises(UsageError, match="literal fields txt are not columns"):
        _scan(path, 1)


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
def test_pack_of_a_pieced_list_on_two_workers_matches_one(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [{**row, "bin": f"files/{i % 5}.bin"} for i, row in enumerate(_rows(60))]  # no empty path
    path = _write(tmp_path, kind, rows)
    options = PackOptions(format="tar", max_samples=9, literal_fields=("txt",))
    pack(path, tmp_path / "one", options, quiet=True)
    monkeypatch.setattr(file_list, "PIECE_BYTES", 64)
    pack(path, tmp_path / "two", replace(options, workers=2), quiet=True)
    assert _files(tmp_path / "two") == _files(tmp_path / "one")


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
def test_a_list_in_a_bucket_is_read_in_pieces(tmp_path: Path, s3: S3Server, s3_root: str, kind: str) -> None:
    """Through the storage seam: byte ranges and row groups of an object, relative cells beside it."""
    options = s3.storage_options()
    store = open_store(s3_root, storage_options=options)
    rows = _rows(30)
    rows[25] = {"key": "s025", "bin": "files/gone.bin"}
    path = _write(tmp_path, kind, rows[:25])
    for name in ["files/0.bin", "files/1.bin", "files/2.bin", "files/3.bin", "files/4.bin"]:
        store.put(name, (tmp_path / name).read_bytes())
    store.put(path.name, path.read_bytes())
    url = f"{s3_root}/{path.name}"
    whole = _scan(url, 1 << 30, storage_options=options)
    assert whole["bin"]["s001"] == (f"{s3_root}/files/1.bin", 11)
    assert _scan(url, 40, storage_options=options) == whole
    bad = _write(tmp_path / "bad", kind, rows)
    for name in ["files/0.bin", "files/1.bin", "files/2.bin", "files/3.bin", "files/4.bin"]:
        store.put(f"bad/{name}", (tmp_path / name).read_bytes())
    store.put(f"bad/{bad.name}", bad.read_bytes())
    message = rf"row 26 \(s025\), field 'bin': stat {s3_root}/bad/files/gone\.bin: no such object \(404\)"
    for piece_bytes in (40, 1 << 30):
        with pytest.raises(DataError, match=message):
            _scan(f"{s3_root}/bad/{bad.name}", piece_bytes, storage_options=options)


def test_an_empty_path_cell_means_the_sample_lacks_the_field(tmp_path: Path) -> None:
    """In a CSV an absent value is an empty cell: it names no file (not the list's own folder)."""
    rows = [{**row, "bin": None if i == 4 else f"files/{i % 5}.bin"} for i, row in enumerate(_rows(12))]
    path = _write(tmp_path, "csv", rows)
    assert b"s004,," in path.read_bytes() or b's004",,' in path.read_bytes()  # the cell is empty
    options = PackOptions(format="tar", literal_fields=("txt",))
    with pytest.raises(IncompleteSamplesError, match="'s004' has no bin"):
        pack(path, tmp_path / "refused", options, quiet=True)
    packed = pack(path, tmp_path / "out", replace(options, skip_incomplete=True), quiet=True)
    assert packed.num_skipped_incomplete == 1
