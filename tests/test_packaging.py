"""The requirements in pyproject.toml: the runtime ones are what the product (shardpipe/, loaders/) imports,
the bench extra holds what bench/ imports, and the dev extra (what `make setup` installs) holds the tests'
needs and all of bench's. Imports are read from the source, those inside functions included."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
FIRST_PARTY = {"shardpipe", "loaders", "bench", "testkit", "tests"}
MODULE_NAMES = {
    "pillow": "PIL",
    "scikit-learn": "sklearn",
    "pyyaml": "yaml",
    "nvidia-nvimgcodec-cu12": "nvidia",
}
"""Distributions whose module has another name than the distribution's."""
PROVIDED_BY = {"boto3": "moto", "werkzeug": "flask"}
"""Modules imported directly whose distribution comes with a declared one (moto's client, flask's server)."""


def distribution(requirement: str) -> str:
    """``"moto[s3]>=5"`` -> ``"moto"``."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match is not None, requirement
    return match[0].lower()


def modules(requirements: list[str]) -> set[str]:
    """The top-level modules the requirements install, with what comes with them."""
    names = {MODULE_NAMES.get(d, d.replace("-", "_")) for d in map(distribution, requirements)}
    return names | {module for module, provider in PROVIDED_BY.items() if provider in names}


def imports(*folders: str) -> dict[str, str]:
    """Every module imported by the files under ``folders`` (or those files), absolute imports only, with
    one file that imports it."""
    found: dict[str, str] = {}
    for folder in folders:
        paths = [ROOT / folder] if folder.endswith(".py") else sorted((ROOT / folder).rglob("*.py"))
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def imported(*folders: str) -> dict[str, str]:
    """Every third-party top-level module imported under ``folders``, with one file that imports it."""
    found: dict[str, str] = {}
    for name, path in imports(*folders).items():
        found.setdefault(name.split(".")[0], path)
    return {m: f for m, f in found.items() if m not in sys.stdlib_module_names and m not in FIRST_PARTY}


def test_every_runtime_requirement_is_imported_by_the_product() -> None:
    product = imported("shardpipe", "loaders")
    assert modules(PROJECT["dependencies"]) - product.keys() == set()


def test_the_product_imports_only_runtime_requirements_and_its_own_extras() -> None:
    extras = PROJECT["optional-dependencies"]
    allowed = modules(PROJECT["dependencies"])
    for name in ("s3", "gcs", "image", "nvimgcodec", "ray"):  # the product's optional features
        allowed |= modules(extras[name])
    undeclared = {m: f for m, f in imported("shardpipe", "loaders").items() if m not in allowed}
    assert undeclared == {}


def test_the_bench_extra_holds_what_the_benchmarks_import() -> None:
    allowed = modules(PROJECT["dependencies"]) | modules(PROJECT["optional-dependencies"]["bench"])
    harnesses = {f"{m.replace('.', '/')}.py" for m in imports("bench") if m.startswith("testkit.")}
    used = imported("bench", *sorted(harnesses))  # with testkit's servers and clusters that bench runs
    assert {m: f for m, f in used.items() if m not in allowed} == {}


def test_the_dev_extra_holds_the_tests_needs_and_all_of_bench() -> None:
    extras = PROJECT["optional-dependencies"]
    dev = {distribution(r) for r in extras["dev"]}
    assert {distribution(r) for r in extras["bench"]} - dev == set()
    allowed = modules(PROJECT["dependencies"]) | modules(extras["dev"])
    assert {m: f for m, f in imported("tests", "testkit").items() if m not in allowed} == {}
