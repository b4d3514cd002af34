"""Fixtures shared by the storage and cache tests, and the markers of the suite's layers.

The loopback S3 and HTTP servers start once per session; each test gets them with faults off and request
counts zeroed, and its own bucket or folder; at the end of the session both servers must have stopped
and stayed within their request limit.

Resource markers: ``s3`` for every test that uses a loopback server (added here, from the fixtures it asks
for), ``dist``, ``ray`` and ``bench`` by test module (``pytestmark``), ``slow`` on single tests that take
seconds. From them every test gets exactly one layer marker (:func:`layer_of`), wherever it lives (the
benchmark tests by their ``bench`` marker, not by their folder): ``e2e`` for a test that runs a benchmark
or the demo end to end (``bench``) or says so (``e2e``); ``integration`` for one that needs processes,
servers or seconds (``dist``, ``ray``, ``s3``, ``slow``); ``unit`` for the rest. ``make test-unit``,
``make test-integration`` and ``make test-e2e`` select by them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.servers import Faults, HTTPServer, S3Server

pytest_plugins = ["pytester"]  # tests/test_layers.py runs the layer rule on a small suite

_bucket_numbers = itertools.count()
_SERVER_FIXTURES = frozenset({"s3_server", "http_server"})


LAYERS = ("unit", "integration", "e2e")
_LAYER_TRIGGERS = (  # the first layer whose markers a test carries is its layer
    ("e2e", frozenset({"e2e", "bench"})),
    ("integration", frozenset({"integration", "dist", "ray", "s3", "slow"})),
)


def layer_of(marker_names: set[str]) -> str:
    """The layer of a test that carries ``marker_names``: the most a test needs decides."""
    for layer, triggers in _LAYER_TRIGGERS:
        if marker_names & triggers:
            return layer
    return "unit"


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by the markers added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.s3)
        names = {marker.name for marker in item.iter_markers()}
        layer = layer_of(names)
        contrary = sorted(names & set(LAYERS) - {layer})
        if contrary:
            raise pytest.UsageError(
                f"{item.nodeid} is marked {', '.join(contrary)}, but its markers {sorted(names)} make it "
                f"{layer}: drop the layer marker or what it contradicts"
            )
        if layer not in names:
            item.add_marker(layer)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = S3Server().start()
    yield server
    server.stop()
    assert not server.alive, "the loopback S3 server is still running after the suite"
    assert not server.control.overflowed, "a test sent the S3 server more requests than its limit"


@pytest.fixture(scope="session")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPServer]:
    server = HTTPServer(tmp_path_factory.mktemp("www")).start()
    yield server
    server.stop()
    assert not server.alive, "the loopback HTTP server is still running after the suite"
    assert not server.control.overflowed, "a test sent the HTTP server more requests than its limit"


@pytest.fixture
def s3(s3_server: S3Server) -> Iterator[S3Server]:
    """The S3 server, faults off and counts zeroed before and after the test."""
    s3_server.control.set_faults(Faults())
    s3_server.control.reset_counts()
    yield s3_server
    s3_server.control.set_faults(Faults())


@pytest.fixture
def s3_root(s3: S3Server) -> str:
    """A fresh bucket for this test; the dataset prefix inside it."""
    return s3.make_bucket(f"test-{next(_bucket_numbers)}") + "/data"


@pytest.fixture
def http(http_server: HTTPServer) -> Iterator[HTTPServer]:
    http_server.control.set_faults(Faults())
    http_server.control.reset_counts()
    yield http_server
    http_server.control.set_faults(Faults())


@pytest.fixture
def http_dir(http: HTTPServer, request: pytest.FixtureRequest) -> tuple[Path, str]:
    """A folder served by the HTTP server for this test, and its URL."""
    name = f"t{next(_bucket_numbers)}"
    folder = Path(http.directory) / name
    folder.mkdir()
    return folder, f"{http.url}/{name}"
