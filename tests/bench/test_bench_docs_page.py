"""``bench.common.docs_page``: a section is replaced or inserted in order, and no other byte of the page
moves."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.common import docs_page
from bench.common.docs_page import ORDER, PREAMBLE, Figure, Section, read_section, render, replace_section

HAND = "Text a person wrote above the sections.\n"
BETWEEN = "\nA note between two sections.\n\n"
AFTER = "\nText after the sections, without a final newline"


def section(**changes: object) -> Section:
    values: dict[str, object] = {
        "name": "bench-io",
        "title": "bench-io: read wait against compute time",
        "date": "2026-12-02",
        "command": "python -m bench --docs docs/benchmarks.md --repeats 9",
        "machine": {
            "cpu": "AMD EPYC 7B13",
            "cores_usable": 2,
            "cores_logical": 4,
            "ram_gib": 7.8,
            "platform": "Linux-6.1-x86_64",
            "gpu": None,
        },
        "versions": {"lmdb": "1.4", "python": "3.11.7", "torch": "2.13.0", "shardpipe commit": "abc123"},
        "settings": {"--batch-size": 64, "--contenders": ["raw-files", "in-memory"], "--out": Path("x")},
        "rules": {"warmup": "the first --warmup steps are discarded"},
        "results": ["| contender | samples/s |", "|---|---|", "| in-memory | 1 |", "", ""],
        "figures": (Figure(Path("throughput.png"), "bench-io.png", "bench-io: MB/s"),),
    }
    values.update(changes)
    return Section(**values)  # type: ignore[arg-type]


def block(name: str, body: str) -> str:
    return f"<!-- {name}:begin -->\n{body}<!-- {name}:end -->"


def test_render_holds_the_run_record_in_order() -> None:
    text = render(section())
    assert text.startswith("## bench-io: read wait against compute time\n\n")
    assert "Generated 2026-12-02 (UTC) by `python -m bench --docs docs/benchmarks.md --repeats 9`." in text
    assert "AMD EPYC 7B13, 2 usable cores (4 logical), 7.8 GiB RAM, no GPU; Linux-6.1-x86_64" in text
    assert "python 3.11.7, torch 2.13.0, lmdb 1.4, shardpipe commit abc123" in text  # the named first
    assert "| --batch-size | 64 |" in text and "| --contenders | raw-files,in-memory |" in text
    assert "- **warmup**: the first --warmup steps are discarded" in text
    assert text.endswith("| in-memory | 1 |\n\n![bench-io: MB/s](img/bench-io.png)\n")
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert headings[1:] == ["### Settings", "### Rules", "### Results"]
    assert "smoke run" not in text
    assert "smoke run" in render(section(settings={"--quick": True}))
    gpu = {**section().machine, "gpu": {"name": "NVIDIA H200", "memory_gib": 139.8}}
    assert "GPU NVIDIA H200 (139.8 GiB)" in render(section(machine=gpu))


def test_section_and_figure_refuse_what_the_page_cannot_hold() -> None:
    with pytest.raises(ValueError, match="bench-nope"):
        section(name="bench-nope")
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        section(date="2026-12-02T10:00")  # a date, no clock time
    with pytest.raises(ValueError, match=r"Throughput\.PNG"):
        Figure(Path("a.png"), "Throughput.PNG", "caption")


def test_settings_values_stay_in_their_table_cell() -> None:
    text = render(section(settings={"--only": "a|b", "--profile": {"n": 1}, "--steps": None}))
    assert "| --only | a\\|b |" in text
    assert '| --profile | `{"n": 1}` |' in text
    assert "| --steps | none |" in text


def test_replacing_a_section_keeps_every_other_byte() -> None:
    page = HAND + block("bench-io", "old io\n") + BETWEEN + block("bench-shuffle", "shuffle\n") + AFTER
    new = replace_section(page, "bench-io", "new io\nsecond line")
    assert (
        new
        == HAND
        + block("bench-io", "new io\nsecond line\n")
        + BETWEEN
        + block("bench-shuffle", "shuffle\n")
        + AFTER
    )
    assert replace_section(new, "bench-io", "new io\nsecond line\n") == new  # the same body: no change
    assert read_section(new, "bench-io") == "new io\nsecond line\n"
    assert read_section(new, "bench-pack") is None


def test_sections_are_inserted_in_order_whatever_the_order_of_the_runs() -> None:
    for runs in (
        ORDER[::-1],
        (
            "bench-shuffle",
            "bench-io",
            "bench-scale",
            "bench-transfer",
            "bench-mix",
            "bench-pack",
            "bench-scaling",
        ),
    ):
        page = PREAMBLE
        for name in runs:
            before = {n: read_section(page, n) for n in ORDER}
            page = replace_section(page, name, f"{name} body\n")
            for other, body in before.items():  # the sections already there are untouched
                if body is not None:
                    assert block(other, body) in page
        assert page.startswith(PREAMBLE + "\n")
        starts = [page.index(f"<!-- {name}:begin -->") for name in ORDER]
        assert starts == sorted(starts)
        assert page.endswith(f"<!-- {ORDER[-1]}:end -->\n")


def test_text_around_sections_is_kept_when_one_is_inserted_between() -> None:
    page = HAND + block("bench-io", "io\n") + BETWEEN + block("bench-scaling", "scaling\n") + AFTER
    new = replace_section(page, "bench-pack", "pack\n")  # goes right after bench-io, before the note
    assert (
        new
        == HAND
        + block("bench-io", "io\n")
        + "\n\n"
        + block("bench-pack", "pack\n")
        + BETWEEN
        + block("bench-scaling", "scaling\n")
        + AFTER
    )
    first = replace_section(page, "bench-transfer", "transfer\n")  # after the last section, before AFTER
    assert first.startswith(page[: page.index(AFTER)] + "\n\n" + block("bench-transfer", "transfer\n"))
    assert first.endswith(AFTER)
    only_later = HAND + block("bench-shuffle", "shuffle\n") + AFTER
    assert replace_section(only_later, "bench-io", "io\n") == HAND + block("bench-io", "io\n") + "\n\n" + (
        block("bench-shuffle", "shuffle\n") + AFTER
    )
    assert (
        replace_section("no newline", "bench-io", "io\n")
        == "no newline\n\n" + block("bench-io", "io\n") + "\n"
    )


def test_broken_markers_and_marker_lines_in_a_body_are_refused() -> None:
    with pytest.raises(ValueError, match="found 2 begin and 1 end"):
        replace_section(block("bench-io", "a\n") + "\n<!-- bench-io:begin -->\n", "bench-io", "b")
    with pytest.raises(ValueError, match="begin first"):
        replace_section("<!-- bench-pack:end -->\n<!-- bench-pack:begin -->\n", "bench-io", "b")
    with pytest.raises(ValueError, match="marker line"):
        replace_section(PREAMBLE, "bench-io", "a\n<!-- bench-pack:end -->\n")
    with pytest.raises(ValueError, match="expected one of"):
        replace_section(PREAMBLE, "bench-ray", "a")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(ORDER),
            st.text(alphabet=st.sampled_from("ab <>!-|#\n"), max_size=40),
        ),
        max_size=12,
    )
)
def test_any_sequence_of_runs_leaves_each_section_its_last_body(runs: list[tuple[str, str]]) -> None:
    page, last = PREAMBLE, {}
    for name, body in runs:
        page = replace_section(page, name, body)
        last[name] = body.rstrip("\n") + "\n"
    assert page.startswith(PREAMBLE)
    assert {n: read_section(page, n) for n in ORDER} == {n: last.get(n) for n in ORDER}
    present = [page.index(f"<!-- {n}:begin -->") for n in ORDER if n in last]
    assert present == sorted(present)


def test_write_section_starts_a_page_and_rewrites_it_atomically(tmp_path: Path) -> None:
    page = tmp_path / "docs" / "benchmarks.md"
    docs_page.write_section(page, "bench-scaling", "scaling\n")
    assert page.read_text() == PREAMBLE + "\n" + block("bench-scaling", "scaling\n") + "\n"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(page.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600
    page.write_text(HAND + page.read_text())  # a page edited around the sections keeps its edits
    docs_page.write_section(page, "bench-io", "io\n")
    text = page.read_text()
    assert text.startswith(HAND + PREAMBLE) and read_section(text, "bench-io") == "io\n"
    assert sorted(p.name for p in page.parent.iterdir()) == ["benchmarks.md"]  # no temporary file left


def test_publish_copies_the_figures_beside_the_page(tmp_path: Path) -> None:
    plot = tmp_path / "out" / "throughput.png"
    plot.parent.mkdir()
    plot.write_bytes(b"\x89PNG fake")
    page = tmp_path / "docs" / "benchmarks.md"
    written = docs_page.publish(page, section(figures=(Figure(plot, "bench-io.png", "io"),)))
    assert written == [page, tmp_path / "docs" / "img" / "bench-io.png"]
    assert written[1].read_bytes() == b"\x89PNG fake"
    assert "![io](img/bench-io.png)" in (read_section(page.read_text(), "bench-io") or "")
    assert docs_page.command_line("bench.scaling", ["--max-ranks", "2", "--out", "a b"]) == (
        "python -m bench.scaling --max-ranks 2 --out 'a b'"
    )
    assert docs_page.flags({"batch_size": 64}) == {"--batch-size": 64}
