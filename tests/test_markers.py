"""The layer rule of tests/conftest.py: every collected test gets exactly one of unit, integration and e2e,
from the markers it carries or the servers it asks for, wherever its file lives.

A small suite of each kind is collected in a pytester session that runs the suite's own hook under the
markers this session declares (pyproject.toml), so a layer marker missing there fails here
(``--strict-markers``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import LAYERS

MakeSuite = Callable[[dict[str, str]], None]

CONFTEST = """
import pytest

from tests.conftest import pytest_collection_modifyitems

@pytest.fixture
def http_server():  # stands in for the loopback server: only its name matters to the rule
    return None
"""

SUITE = {
    "test_plain.py": "def test_plain():\n    pass\n",
    "test_ranks.py": "import pytest\npytestmark = pytest.mark.dist\ndef test_ranks():\n    pass\n",
    "test_server.py": "def test_server(http_server):\n    pass\n",
    "test_params.py": (
        "import pytest\n"
        "@pytest.mark.parametrize('context', ['fork', pytest.param('spawn', marks=pytest.mark.slow)])\n"
        "def test_params(context):\n    pass\n"
    ),
    "test_by_hand.py": (
        "import pytest\n"
        "@pytest.mark.e2e\ndef test_declared_e2e():\n    pass\n"
        "@pytest.mark.integration\ndef test_declared_integration():\n    pass\n"
        "@pytest.mark.integration\n@pytest.mark.ray\ndef test_declared_and_derived():\n    pass\n"
    ),
    "bench/test_layer_bench.py": (
        "import pytest\npytestmark = pytest.mark.bench\n"
        "def test_bench():\n    pass\n"
        "@pytest.mark.dist\ndef test_bench_on_ranks():\n    pass\n"
    ),
    "bench/test_layer_page.py": "def test_page():\n    pass\n",
}

EXPECTED = {
    "test_plain.py::test_plain": "unit",
    "test_ranks.py::test_ranks": "integration",
    "test_server.py::test_server": "integration",
    "test_params.py::test_params[fork]": "unit",
    "test_params.py::test_params[spawn]": "integration",
    "test_by_hand.py::test_declared_e2e": "e2e",
    "test_by_hand.py::test_declared_integration": "integration",
    "test_by_hand.py::test_declared_and_derived": "integration",
    "bench/test_layer_bench.py::test_bench": "e2e",
    "bench/test_layer_bench.py::test_bench_on_ranks": "e2e",
    "bench/test_layer_page.py::test_page": "unit",  # a benchmark's folder alone makes no layer
}


@pytest.fixture
def suite(pytester: pytest.Pytester, pytestconfig: pytest.Config) -> MakeSuite:
    """Writes a suite of test files beside the rule and the markers this session runs under."""
    markers = "\n    ".join(pytestconfig.getini("markers"))
    pytester.makeini(f"[pytest]\naddopts = --strict-markers\nmarkers =\n    {markers}\n")
    pytester.makeconftest(CONFTEST)

    def make(files: dict[str, str]) -> None:
        for name, text in files.items():
            path = pytester.path / name
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)

    return make


def test_every_collected_test_gets_exactly_one_layer(pytester: pytest.Pytester, suite: MakeSuite) -> None:
    suite(SUITE)
    items, _ = pytester.inline_genitems()
    layers = {item.nodeid: [m.name for m in item.iter_markers() if m.name in LAYERS] for item in items}
    assert layers == {nodeid: [layer] for nodeid, layer in EXPECTED.items()}
    server = next(item for item in items if item.nodeid == "test_server.py::test_server")
    assert server.get_closest_marker("s3") is not None  # the server fixture gave it s3 first


@pytest.mark.parametrize("layer", LAYERS)
def test_selecting_a_layer_collects_its_tests_only(
    pytester: pytest.Pytester, suite: MakeSuite, layer: str
) -> None:
    suite(SUITE)
    result = pytester.runpytest_inprocess("--collect-only", "-q", "-m", layer)
    listed = [line for line in result.outlines if "::" in line]
    assert sorted(listed) == sorted(nodeid for nodeid, given in EXPECTED.items() if given == layer)


def test_a_layer_marker_contradicting_what_a_test_uses_is_refused(
    pytester: pytest.Pytester, suite: MakeSuite
) -> None:
    suite({"test_wrong.py": "import pytest\n@pytest.mark.unit\n@pytest.mark.dist\ndef test_w():\n    pass\n"})
    result = pytester.runpytest_inprocess("--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*test_wrong.py::test_w is marked unit, but its markers*make it integration*"]
    )
