"""Every constant docs/design.md names (`module.NAME = value` in backticks) has that value in the code."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
CONSTANT = re.compile(r"`((?:[a-z_][a-z0-9_]*\.)+[a-z_][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([^`]+)`")
"""A backticked ``package.module.NAME = literal``: the module path, the name and the literal."""
MIN_CONSTANTS = 15


def documented() -> list[tuple[str, str, str]]:
    """``(module, name, literal)`` for each constant the design reference names, in order."""
    text = DESIGN.read_text(encoding="utf-8")
    return [(module, name, literal.strip()) for module, name, literal in CONSTANT.findall(text)]


def test_design_doc_names_enough_constants() -> None:
    found = documented()
    assert len(found) >= MIN_CONSTANTS, (
        f"{DESIGN.relative_to(ROOT)} names {len(found)} constants as `module.NAME = value`, "
        f"fewer than {MIN_CONSTANTS}: has the form changed?"
    )


def test_design_doc_constants_match_the_code() -> None:
    mismatches: list[str] = []
    for module, name, literal in documented():
        try:
            expected = ast.literal_eval(literal)
        except (ValueError, SyntaxError) as exc:
            mismatches.append(f"{module}.{name}: documented {literal!r} is not a Python literal ({exc})")
            continue
        try:
            actual = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            mismatches.append(f"{module}.{name}: documented {literal}, not found in the code ({exc})")
            continue
        if type(actual) is not type(expected) or actual != expected:
            mismatches.append(f"{module}.{name}: documented {literal}, the code has {actual!r}")
    assert not mismatches, f"{DESIGN.relative_to(ROOT)} disagrees with the code:\n" + "\n".join(
        f"  {line}" for line in mismatches
    )
