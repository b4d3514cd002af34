"""``bench.common.report.write_report``: the one writer of every benchmark's report files and docs section."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common.docs_page import read_section
from bench.common.report import Chart, DocsSection, Run, write_report

MACHINE = {
    "cpu": "a CPU",
    "cores_usable": 2,
    "cores_logical": 4,
    "ram_gib": 8.0,
    "platform": "x",
    "gpu": None,
}


def _run(out: Path) -> Run:
    args = argparse.Namespace(batch_size=64, out=out)
    return Run("bench.example", ("--batch-size", "64"), vars(args), MACHINE, {"python": "3.11"})


def test_writes_the_record_the_markdown_and_the_charts_and_returns_them_in_order(tmp_path: Path) -> None:
    chart = Chart("plot.png", lambda path: path.write_bytes(b"png"), "a caption")
    paths = write_report(tmp_path / "out", _run(tmp_path), {"results": [1.5]}, "# report\n", charts=[chart])
    assert paths == [tmp_path / "out" / name for name in ("report.json", "report.md", "plot.png")]
    assert json.loads(paths[0].read_text()) == {"results": [1.5]}
    assert paths[1].read_text() == "# report\n" and paths[2].read_bytes() == b"png"


def test_the_docs_section_holds_the_command_every_flag_the_settings_and_the_chart(tmp_path: Path) -> None:
    page = tmp_path / "docs" / "benchmarks.md"
    chart = Chart("plot.png", lambda path: path.write_bytes(b"png"), "a caption")
    docs = DocsSection(page, "bench-shuffle", "a title", {"rule": "why"}, ["| a |"], {"extra": 3})
    paths = write_report(tmp_path / "out", _run(tmp_path), {}, "", charts=[chart], docs=docs)
    assert paths[3:] == [page, page.parent / "img" / "bench-shuffle.png"]
    assert paths[4].read_bytes() == b"png"
    section = read_section(page.read_text(), "bench-shuffle") or ""
    assert section.startswith("## bench-shuffle: a title\n")
    assert "`python -m bench.example --batch-size 64`" in section
    assert section.index("| --batch-size | 64 |") < section.index("| extra | 3 |")
    assert "- **rule**: why" in section and "\n| a |\n" in section
    assert "![bench-shuffle: a caption](img/bench-shuffle.png)" in section


def test_several_charts_are_published_under_the_section_and_their_own_names(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    charts = [Chart(f"{name}.png", lambda path: path.write_bytes(b"png"), name) for name in ("one", "two")]
    docs = DocsSection(page, "bench-pack", "a title", {}, [])
    paths = write_report(tmp_path / "out", _run(tmp_path), {}, "", charts=charts, docs=docs)
    assert [p.name for p in paths[-2:]] == ["bench-pack-one.png", "bench-pack-two.png"]
