"""Every package's docstring names each of its modules and subpackages, so a reader finds them all."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def members(package: Path) -> list[str]:
    """The package's direct modules (less ``__init__`` and ``__main__``) and subpackages."""
    modules = {p.stem for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    subpackages = {p.parent.name for p in package.glob("*/__init__.py")}
    return sorted(modules | subpackages)


def test_package_docstrings_name_every_member() -> None:
    missing: dict[str, list[str]] = {}
    for top in ("shardpipe", "loaders"):
        for init in sorted((ROOT / top).rglob("__init__.py")):
            doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
            absent = [n for n in members(init.parent) if not re.search(rf"(?<!\w){re.escape(n)}(?!\w)", doc)]
            if absent:
                missing[init.parent.relative_to(ROOT).as_posix()] = absent
    assert not missing, "package docstrings lack these names:\n" + "\n".join(
        f"  {package}: {', '.join(names)}" for package, names in missing.items()
    )
