"""Loopback servers for the storage tests and the remote benchmark: S3 (moto) and a Range-capable HTTP server.

Both listen on 127.0.0.1 on a free port, count every request by (method, path), and share one fault switch:
``Faults(rate, kinds, seed)`` makes that fraction of requests fail (HTTP 500, a dropped connection, or a slow
answer) with the sequence of decisions fixed by the seed. ``latency_s`` delays every request and
``bandwidth`` caps each response's bytes per second (for the benchmark). Keys under a ``forbidden`` prefix
answer 403. A server refuses (503) past ``max_requests`` and remembers it, so a runaway test fails at
teardown instead of running on.
"""

from __future__ import annotations

import json
import logging
import random
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

FAULT_KINDS = ("500", "reset", "slow")
#: Requests under this path read the counts or set the faults; they are not counted themselves.
CONTROL_PATH = "/_shardpipe/"
logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request drowns test output
_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


@dataclass(frozen=True, slots=True)
class Faults:
    rate: float = 0.0
    kinds: tuple[str, ...] = FAULT_KINDS  # a list is accepted too (from JSON)
    seed: int = 0
    slow_s: float = 0.3
    latency_s: float = 0.0
    bandwidth: float | None = None
    """Bytes per second per response; None for no cap."""


class Control:
    """The switch and the request log shared by a server's handler threads."""

    def __init__(self, max_requests: int) -> None:
        self.max_requests = max_requests
        self.counts: Counter[tuple[str, str]] = Counter()
        self.total = 0
        self.injected = 0
        self.bytes_sent = 0
        self.overflowed = False
        self.forbidden: tuple[str, ...] = ("forbidden/",)
        self._lock = threading.Lock()
        self._faults = Faults()
        self._rng = random.Random(0)

    def set_faults(self, faults: Faults) -> None:
        with self._lock:
            self._faults = faults
            self._rng = random.Random(faults.seed)

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()
            self.total = 0
            self.injected = 0
            self.bytes_sent = 0

    def count(self, method: str, path_suffix: str) -> int:
        """Requests so far of ``method`` whose path ends with ``path_suffix``."""
        with self._lock:
            return sum(n for (m, p), n in self.counts.items() if m == method and p.endswith(path_suffix))

    def admit(self, method: str, path: str) -> tuple[str | None, Faults]:
        """Record a request; return the fault to inject ("over" past the limit) and the current settings."""
        with self._lock:
            self.counts[(method, path)] += 1
            self.total += 1
            faults = self._faults
            if self.total > self.max_requests:
                self.overflowed = True
                return "over", faults
            drawn = self._rng.random() < faults.rate and faults.rate > 0
            kind = faults.kinds[self._rng.randrange(len(faults.kinds))] if drawn else None
            self.injected += kind is not None
        return kind, faults

    def sent(self, num_bytes: int) -> None:
        with self._lock:
            self.bytes_sent += num_bytes

    def is_forbidden(self, path: str) -> bool:
        return any(f"/{prefix}" in path for prefix in self.forbidden)


def _throttled(chunks: Iterable[bytes], bandwidth: float | None, control: Control) -> Iterator[bytes]:
    """The response body, counted, in pieces paced to ``bandwidth`` bytes per second."""
    for chunk in chunks:
        for start in range(0, len(chunk), 64 * 1024):
            piece = chunk[start : start + 64 * 1024]
            if bandwidth:
                time.sleep(len(piece) / bandwidth)
            control.sent(len(piece))
            yield piece


def _drop(sock: socket.socket) -> None:
    """Close the connection under the client's feet, mid-request."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.shutdown(socket.SHUT_RDWR)


class FaultMiddleware:
    """WSGI wrapper around moto's app: counts, delays, throttles and fails requests as told."""

    def __init__(self, app: Callable[..., Iterable[bytes]], control: Control) -> None:
        self.app = app
        self.control = control

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith(CONTROL_PATH):
            return self._control(path.removeprefix(CONTROL_PATH), environ, start_response)
        kind, faults = self.control.admit(environ["REQUEST_METHOD"], path)
        time.sleep(faults.latency_s)
        if kind is not None or self.control.is_forbidden(path):
            environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        if kind == "reset":
            _drop(environ["werkzeug.socket"])
            start_response("500 Internal Server Error", [("Connection", "close")])
            return []
        if kind in ("500", "over") or self.control.is_forbidden(path):
            code, status = (
                ("AccessDenied", "403 Forbidden")
                if kind is None
                else ("InternalError", "500 Internal Server Error")
                if kind == "500"
                else ("ServiceUnavailable", "503 Service Unavailable")
            )
            body = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
            if environ["REQUEST_METHOD"] == "HEAD":
                body = b""
            start_response(
                status,
                [
                    ("Content-Type", "application/xml"),
                    ("Content-Length", str(len(body))),
                    ("Connection", "close"),
                ],
            )
            return [body]
        result = self.app(environ, start_response)  # reads the request body before any delay
        if kind == "slow":
            time.sleep(faults.slow_s)
        return _throttled(result, faults.bandwidth, self.control)

    def _control(
        self, action: str, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> list[bytes]:
        """Counts and switches for a client in another process (the benchmark runs the server apart)."""
        if action == "faults":
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            self.control.set_faults(Faults(**json.loads(body)))
        elif action == "reset":
            self.control.reset_counts()
        control = self.control
        stats = {"total": control.total, "bytes_sent": control.bytes_sent, "injected": control.injected}
        body = json.dumps(stats).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]


def _ranges_cost_their_bytes() -> None:
    """Make moto's objects hand out their value without copying it: moto copies a whole object out of its
    buffer twice per GET, then slices the range, so a ranged GET costs the object's size where S3's costs
    the range, and benchmarks of ranged reads would measure that copy (docs/design-record.md, "Remote
    random gets"). The value is kept as immutable bytes beside moto's buffer, which the rest of moto still
    reads."""
    from moto.s3.models import FakeKey

    if getattr(FakeKey, "_shardpipe_value", False):
        return
    stored: property = FakeKey.__dict__["value"]
    read, write = stored.fget, stored.fset
    assert read is not None and write is not None

    def get(key: Any) -> bytes:
        value: bytes | None = getattr(key, "_value_bytes", None)
        return read(key) if value is None else value

    def put(key: Any, value: bytes | str) -> None:
        write(key, value)
        key._value_bytes = value if isinstance(value, bytes) else None

    FakeKey.value = property(get, put)  # type: ignore[assignment]
    FakeKey._shardpipe_value = True  # type: ignore[attr-defined]


class S3Server:
    """moto's S3 on 127.0.0.1 behind :class:`FaultMiddleware`; ``storage_options`` point s3fs at it.
    A ranged GET costs its range, as S3's does (:func:`_ranges_cost_their_bytes`)."""

    def __init__(self, max_requests: int = 200_000) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from moto.server import ThreadedMotoServer
        from werkzeug.serving import make_server

        _ranges_cost_their_bytes()
        self.control = Control(max_requests)
        control = self.control

        class _Server(ThreadedMotoServer):
            def _server_entry(self) -> None:  # moto's own entry, with the middleware around its app
                app = FaultMiddleware(DomainDispatcherApplication(create_backend_app), control)
                self._server = make_server(
                    self._ip_address, self._port, app, True, request_handler=MotoRequestHandler
                )
                self._server_ready_event.set()
                self._server.serve_forever()

        self._moto = _Server(ip_address="127.0.0.1", port=0, verbose=False)
        self.endpoint_url = ""

    def start(self) -> S3Server:
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        self._moto.stop()

    @property
    def alive(self) -> bool:
        thread = self._moto._thread
        return thread is not None and thread.is_alive()

    def storage_options(self, **extra: Any) -> dict[str, Any]:
        return {
            "endpoint_url": self.endpoint_url,
            "key": "testing-key-id",
            "secret": "testing-secret-value",
            "client_kwargs": {"region_name": "us-east-1"},
            **extra,
        }

    def make_bucket(self, name: str) -> str:
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id="testing-key-id",
            aws_secret_access_key="testing-secret-value",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=name)
        return f"s3://{name}"


class _RangeHandler(SimpleHTTPRequestHandler):
    """Files with Range support (206, Content-Range, 416); directory listings as the stdlib does them."""

    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _answer(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _serve(self, body: bool) -> None:
        control = self.server.control
        path = unquote(urlsplit(self.path).path)
        kind, faults = control.admit(self.command, path)
        time.sleep(faults.latency_s)
        if kind == "reset":
            _drop(self.connection)
            self.close_connection = True
            return
        if kind in ("500", "over"):
            self._answer(500 if kind == "500" else 503, {"Connection": "close"})
            self.close_connection = True
            return
        if kind == "slow":
            time.sleep(faults.slow_s)
        if control.is_forbidden(path):
            return self._answer(403, {})
        root = Path(self.directory).resolve()
        target = (root / path.lstrip("/")).resolve()
        if root not in (target, *target.parents) or not target.exists():
            return self._answer(404, {})
        if target.is_dir():
            return super().do_GET() if body else super().do_HEAD()
        self._send_file(target, body, faults.bandwidth)

    def _send_file(self, target: Path, body: bool, bandwidth: float | None) -> None:
        size = target.stat().st_size
        start, stop, status = 0, size, 200
        if spec := self.headers.get("Range"):
            match = _RANGE.match(spec.strip())
            if match is None or (not match[1] and not match[2]):
                return self._answer(416, {"Content-Range": f"bytes */{size}"})
            if match[1]:
                start, stop = int(match[1]), min(size, int(match[2]) + 1 if match[2] else size)
            else:
                start = max(0, size - int(match[2]))
            if start >= size or start >= stop:
                return self._answer(416, {"Content-Range": f"bytes */{size}"})
            status = 206
        headers = {
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "Content-Length": str(stop - start),
        }
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            with target.open("rb") as f:
                f.seek(start)
                for piece in _throttled([f.read(stop - start)], bandwidth, self.server.control):
                    self.wfile.write(piece)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    control: Control


class HTTPServer:
    """A Range-capable HTTP server over ``directory`` on 127.0.0.1."""

    def __init__(self, directory: Path, max_requests: int = 200_000) -> None:
        self.directory = directory
        self.control = Control(max_requests)
        handler = type("Handler", (_RangeHandler,), {})

        def make(*args: Any) -> _RangeHandler:
            made: _RangeHandler = handler(*args, directory=str(directory))
            return made

        self._server = _HTTPServer(("127.0.0.1", 0), make)
        self._server.control = self.control
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        host, port = self._server.server_address[:2]
        self.url = f"http://{host!s}:{port}"

    def start(self) -> HTTPServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()
