"""Real Ray clusters for the tests: started inside the test run, and nothing of them left running after it.

:func:`two_node_cluster` starts a head (``ray start --head``) and a second node (``ray start --address``) on
127.0.0.1, each with one CPU, small memory settings, the dashboard off, no usage stats, its own temporary
folder and free ports, and yields the head's address. ``ray stop`` cannot be scoped to one cluster (it
stops every Ray of the user on the machine, other people's test runs included), so each ``ray start``
runs as the leader of a new session, and teardown kills exactly the processes of those sessions
(``ray stop --force``'s SIGKILL), then fails if any of them is still alive.

:func:`token_auth` sets Ray's token authentication for this process and the nodes it starts, with one
token per test process in a temporary file: Ray's driver side caches the first token it reads, so every
cluster and local Ray the test process talks to shares it, and none of them reads or writes ``~/.ray``.
"""

from __future__ import annotations

import atexit
import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

START_TIMEOUT_S = 90.0
"""Seconds one ``ray start`` may take on a loaded machine before the fixture gives up."""
STOP_TIMEOUT_S = 30.0
NODE_SETTINGS = ("--num-cpus=1", "--memory=500000000", "--object-store-memory=80000000")
"""Small: the scheduler's view of each node, and an object store near Ray's minimum."""
READY = "Ray runtime started"


@dataclass(frozen=True, slots=True)
class RayNode:
    process: subprocess.Popen[bytes]
    """The blocking ``ray start``: leader of the session every process of this node belongs to."""
    temp_dir: Path
    log: Path


@dataclass(frozen=True, slots=True)
class Cluster:
    address: str
    nodes: tuple[RayNode, ...]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@functools.cache
def _token_file() -> Path:
    """One token per test process (Ray's driver side caches the first token it reads), removed at exit."""
    folder = tempfile.mkdtemp(prefix="sp-ray-auth-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    token = Path(folder) / "token"
    token.write_text(secrets.token_hex(32))
    return token


@contextmanager
def token_auth() -> Iterator[None]:
    """Token authentication with this process's token file, set in its environment meanwhile."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_AUTH_MODE", "token")
        env.setenv("RAY_AUTH_TOKEN_PATH", str(_token_file()))
        env.setenv("RAY_USAGE_STATS_ENABLED", "0")
        env.delenv("RAY_ADDRESS", raising=False)
        yield


def head_args(port: int) -> list[str]:
    """``ray start`` arguments of a head node on ``port``: dashboard off, usage stats off."""
    return [
        "--head", f"--port={port}", "--include-dashboard=false", f"--dashboard-port={free_port()}",
        "--disable-usage-stats",
    ]  # fmt: skip


@contextmanager
def two_node_cluster() -> Iterator[Cluster]:
    """A head and a second node on 127.0.0.1; yields when both are up, stops both on exit."""
    nodes: list[RayNode] = []
    try:
        port = free_port()
        nodes.append(start_node(head_args(port)))
        nodes.append(start_node([f"--address=127.0.0.1:{port}"]))
        yield Cluster(f"127.0.0.1:{port}", tuple(nodes))
    finally:
        stop_nodes(nodes)


def start_node(args: list[str]) -> RayNode:
    """``ray start --block`` in a session of its own; returns once it printed that the node is up.

    The temporary folder is short (``/tmp/sp-ray-...``): Ray puts Unix sockets in it, whose paths are
    limited to about 100 bytes.
    """
    temp_dir = Path(tempfile.mkdtemp(prefix="sp-ray-", dir="/tmp"))
    log = temp_dir / "start.log"
    ray = Path(sys.executable).with_name("ray")
    command = [
        str(ray), "start", *args, *NODE_SETTINGS, "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}",
        f"--dashboard-agent-listen-port={free_port()}", "--log-style=record", "--block",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    node = RayNode(process, temp_dir, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while READY not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:]
            stop_nodes([node])
            what = f"ray start {' '.join(args)}"
            raise RuntimeError(f"{what} did not come up (exit {process.returncode}):\n{tail}")
        time.sleep(0.2)
    return node


def session_processes(leaders: list[int]) -> list[psutil.Process]:
    """Every live (not zombie) process whose session is led by one of ``leaders``."""
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getsid(proc.pid) in leaders and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def stop_nodes(nodes: list[RayNode]) -> None:
    """Kill every process of the nodes' sessions, reap the ``ray start`` leaders, check nothing is left."""
    leaders = [node.process.pid for node in nodes]
    members = session_processes(leaders)
    for proc in members:
        with suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    for node in nodes:
        if node.process.poll() is None:
            node.process.kill()
        node.process.wait(timeout=STOP_TIMEOUT_S)
    psutil.wait_procs(members, timeout=STOP_TIMEOUT_S)
    left = session_processes(leaders)
    if left:
        names = ", ".join(f"{p.pid} {p.name()}" for p in left)
        raise RuntimeError(f"Ray processes of the test cluster still running after teardown: {names}")
    for node in nodes:
        shutil.rmtree(node.temp_dir, ignore_errors=True)


def local_ray_processes() -> list[psutil.Process]:
    """Live Ray daemons and workers among this process's descendants (a Ray that ``ray.init`` started)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            name, command = proc.name(), " ".join(proc.cmdline())
            ray_process = name in ("raylet", "gcs_server") or name.startswith("ray::") or "/ray/" in command
            if ray_process and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found
