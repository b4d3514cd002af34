"""A benchmark run's record, written one way for every benchmark: ``report.json``, ``report.md`` and the
run's charts in its output folder, and with ``--docs PAGE`` its section of that page.

The benchmark measures and renders; :func:`write_report` writes. The docs section is filled from the run
(:class:`Run`: the command as typed, every parsed argument as its flag, the machine, the versions) and from
what the benchmark says about its figures (:class:`DocsSection`: title, rules, result lines, settings beyond
the flags); a run's chart is published beside the page as ``img/<section>.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import docs_page, system


@dataclass(frozen=True, slots=True)
class Run:
    """What produced a report: ``python -m <module> <argv>``, its parsed arguments, the machine, the
    versions."""

    module: str
    argv: tuple[str, ...]
    args: Mapping[str, Any]  # vars() of the parsed arguments
    machine: Mapping[str, Any]  # system.hardware()
    versions: Mapping[str, str]  # system.versions(), and what the benchmark adds

    @classmethod
    def of(cls, module: str, argv: Sequence[str] | None, args: argparse.Namespace, **versions: str) -> Run:
        """This process's run: ``argv`` None means the command line; ``versions`` add to the measured."""
        words = tuple(sys.argv[1:] if argv is None else argv)
        return cls(module, words, dict(vars(args)), system.hardware(), {**system.versions(), **versions})

    @property
    def parameters(self) -> dict[str, Any]:
        """The parsed arguments as JSON values (paths as text)."""
        return {k: str(v) if isinstance(v, Path) else v for k, v in self.args.items()}


@dataclass(frozen=True, slots=True)
class Chart:
    """A plot of the run, drawn into the output folder as ``file``."""

    file: str
    draw: Callable[[Path], None]  # writes the plot to the path it is given
    caption: str  # under it on the docs page


@dataclass(frozen=True, slots=True)
class DocsSection:
    """The run's section of the docs page ``page``: what the benchmark says about its figures."""

    page: Path
    name: str  # one of docs_page.SECTIONS
    title: str  # shown as "<name>: <title>"
    rules: Mapping[str, str]
    results: Sequence[str]  # Markdown lines: the tables and what the run concluded
    settings: Mapping[str, Any] = field(default_factory=dict)  # shown after the flags


def measured_on(created: str, machine: Mapping[str, Any]) -> str:
    """When and on what a run measured: the words a report.md's first paragraph starts with."""
    gpu = machine.get("gpu")
    cores, ram = machine["cores_usable"], machine["ram_gib"]
    name = gpu["name"] if isinstance(gpu, dict) else "none"
    return f"{created} on {machine['cpu']} ({cores} usable cores, {ram} GiB RAM, GPU: {name})"


def write_report(
    out: Path,
    run: Run,
    record: Mapping[str, Any],
    markdown: str,
    *,
    charts: Sequence[Chart] = (),
    docs: DocsSection | None = None,
) -> list[Path]:
    """Write ``out/report.json`` (``record``), ``out/report.md`` (``markdown``) and every chart into ``out``;
    with ``docs``, the run's section of the docs page, the charts as its figures. Return the paths written,
    in that order."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.json", out / "report.md"]
    paths[0].write_text(json.dumps(record, indent=1) + "\n")
    paths[1].write_text(markdown)
    for chart in charts:
        chart.draw(out / chart.file)
        paths.append(out / chart.file)
    if docs is not None:
        paths += docs_page.publish(docs.page, _section(out, run, charts, docs))
    return paths


def _section(out: Path, run: Run, charts: Sequence[Chart], docs: DocsSection) -> docs_page.Section:
    """The docs page's section of this run; one chart is published as ``<name>.png``, several as
    ``<name>-<file stem>.png``."""
    figures = tuple(
        docs_page.Figure(
            out / chart.file,
            f"{docs.name}.png" if len(charts) == 1 else f"{docs.name}-{Path(chart.file).stem}.png",
            f"{docs.name}: {chart.caption}",
        )
        for chart in charts
    )
    return docs_page.Section(
        name=docs.name,
        title=f"{docs.name}: {docs.title}",
        date=docs_page.utc_date(),
        command=docs_page.command_line(run.module, run.argv),
        machine=run.machine,
        versions=run.versions,
        settings={**docs_page.flags(run.args), **docs.settings},
        rules=docs.rules,
        results=docs.results,
        figures=figures,
    )
