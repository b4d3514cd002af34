"""Rows of cells as the reports print them: aligned text for the terminal, Markdown for the files."""

from __future__ import annotations


def aligned(rows: list[list[str]]) -> list[str]:
    """Rows of cells as text lines: first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]


def markdown_table(rows: list[list[str]]) -> list[str]:
    """Rows of cells (the first is the header) as Markdown table lines."""
    return ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])] + [
        "| " + " | ".join(r) + " |" for r in rows[1:]
    ]
