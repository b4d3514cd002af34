"""The Ray engine: a ``concurrent.futures.Executor`` whose ``submit(fn, *args)`` runs ``fn`` as a Ray task.

The pack hands its executor module-level functions (scan one chunk, write one shard), so the local process
pool and a Ray cluster run the same units and return the same values. Invariants:

* at most ``max_workers`` tasks are in flight; the rest wait in this process, so a cancelled future that
  has not started never reaches Ray (the pack cancels what is pending when a shard fails);
* a task whose worker process or node dies is retried by Ray (``max_retries``); an exception the task
  raises is not retried, and comes back as the original exception (Ray's ``RayTaskError`` is unwrapped to
  its cause), so the CLI maps shardpipe's errors to exit codes as with the local pool;
* with ``visible_paths``, every task first checks that those paths exist on its node and otherwise fails
  at once with a :class:`~shardpipe.errors.DataError` naming the node and the path: a local path seen from a
  remote node is the usual mistake on a multi-node cluster, and writing there would scatter the shards.

Ray is imported only when an engine is made, so ``import shardpipe`` never needs the ``ray`` extra.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent import futures
from concurrent.futures import CancelledError, Executor, Future, InvalidStateError
from dataclasses import dataclass
from functools import partial
from typing import Any, ParamSpec, TypeVar

from shardpipe.errors import DataError, UsageError

P = ParamSpec("P")
T = TypeVar("T")

MAX_RETRIES = 3
"""Ray's retries of a task whose worker process or node died; exceptions raised by the task are final."""
LOCAL_OBJECT_STORE_BYTES = 256 << 20
"""Object store of a Ray started here: tasks exchange sample tables and manifest entries, not payloads."""
CONNECT_TIMEOUT_S = 10.0
"""How long a cluster's address may take to accept a connection before the engine gives up."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class TaskLostError(DataError):
    """A task could not finish because Ray lost it (its worker or node kept dying, or its result was lost).

    A data error for the CLI (exit 1): the finished shards are journaled, so ``--resume`` continues.
    """


@dataclass(frozen=True, slots=True)
class _Work:
    future: Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class RayExecutor(Executor):
    """Runs submitted module-level functions as Ray tasks, at most ``max_workers`` at a time.

    ``address`` (else ``RAY_ADDRESS``) joins an existing cluster; with neither, a small local Ray is
    started (dashboard off, usage stats off unless the user set ``RAY_USAGE_STATS_ENABLED``) and stopped by
    :meth:`shutdown`. An already connected Ray (``ray.init`` called by the user) is used as it is and left
    connected. ``max_workers`` defaults to the cluster's CPU count. ``initializer`` runs once in each Ray
    worker process before its first task, as ``ProcessPoolExecutor``'s does in each of its processes.
    """

    def __init__(
        self,
        address: str | None = None,
        max_workers: int | None = None,
        *,
        visible_paths: Iterable[os.PathLike[str] | str] = (),
        initializer: Callable[[], object] | None = None,
    ) -> None:
        if max_workers is not None and max_workers < 1:
            raise UsageError(f"max_workers must be at least 1, got {max_workers}")
        try:
            import ray
        except ImportError as exc:
            raise UsageError("the Ray engine needs the ray extra: pip install 'shardpipe[ray]'") from exc
        self._ray: Any = ray  # partly annotated: used as Any
        self._owns_connection = not ray.is_initialized()
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address is not None:
            _check_reachable(address)
        if self._owns_connection:
            _connect(ray, address, max_workers)
        self.max_workers = max_workers or max(1, int(self._ray.cluster_resources().get("CPU", 1)))
        self._visible = tuple(os.fspath(p) for p in visible_paths)
        self._initializer = initializer
        self._remotes: dict[Callable[..., Any], Any] = {}
        self._queue: deque[_Work] = deque()
        self._in_flight: dict[Future[Any], Any] = {}  # the caller's future -> its ObjectRef (None: starting)
        self._lock = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._dispatch, name="shardpipe-ray-dispatch", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to a RayExecutor after shutdown")
            self._queue.append(_Work(future, fn, args, kwargs))
            self._lock.notify_all()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting work; then wait for it (or cancel it) and disconnect, stopping a Ray started here.

        ``wait=False`` also cancels the tasks running on Ray: nothing would collect them after a disconnect.
        """
        with self._lock:
            if self._closed and not self._thread.is_alive():
                return
            self._closed = True
            if cancel_futures or not wait:
                while self._queue:
                    self._queue.popleft().future.cancel()
            self._lock.notify_all()
        self._thread.join()
        with self._lock:
            running = dict(self._in_flight)
        if wait:
            futures.wait(running)
        else:
            for future, ref in running.items():
                if ref is not None:
                    self._ray.cancel(ref, force=True)
                _settle(future, exception=CancelledError("the Ray engine was shut down"))
        if self._owns_connection:
            self._ray.shutdown()

    def _dispatch(self) -> None:
        """Launch queued work whenever a slot is free; until closed and the queue is empty."""
        while True:
            with self._lock:
                while not (self._queue and len(self._in_flight) < self.max_workers) and not (
                    self._closed and not self._queue
                ):
                    self._lock.wait()
                if self._closed and not self._queue:
                    return
                work = self._queue.popleft()
                if not work.future.set_running_or_notify_cancel():
                    continue
                self._in_flight[work.future] = None  # the slot is taken before the task exists
            try:
                ref = self._remote(work.fn).remote(
                    self._visible_here(), self._initializer, work.fn, work.args, work.kwargs
                )
            except BaseException as exc:  # an argument that does not serialize, a lost connection
                self._finished(work.future, None, exc)
                continue
            with self._lock:
                if work.future in self._in_flight:
                    self._in_flight[work.future] = ref
            ref.future().add_done_callback(partial(self._on_ray_done, work.future))

    def _on_ray_done(self, future: Future[Any], ray_future: Future[Any]) -> None:
        """Runs on Ray's callback thread: Python bookkeeping only, no Ray calls."""
        exc = ray_future.exception()
        self._finished(future, None if exc is not None else ray_future.result(), exc)

    def _finished(self, future: Future[Any], result: Any, exc: BaseException | None) -> None:
        if exc is None:
            _settle(future, result=result)
        else:
            _settle(future, exception=_unwrap(self._ray, exc))
        with self._lock:
            self._in_flight.pop(future, None)
            self._lock.notify_all()

    def _remote(self, fn: Callable[..., Any]) -> Any:
        """One Ray remote function per submitted function, named after it (as Ray's tools show tasks)."""
        remote = self._remotes.get(fn)
        if remote is None:
            name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
            remote = self._ray.remote(_run_checked).options(
                name=name, max_retries=MAX_RETRIES, retry_exceptions=False, num_cpus=1
            )
            self._remotes[fn] = remote
        return remote

    def _visible_here(self) -> tuple[str, ...]:
        """Each visible path, or its nearest ancestor that exists here: what a task's node must see too
        (OUT is created by the driver after the scan, so scan tasks check the folder it will be made in)."""
        found = []
        for path in self._visible:
            while not os.path.exists(path) and os.path.dirname(path) != path:
                path = os.path.dirname(path)
            found.append(path)
        return tuple(found)


def _settle(future: Future[Any], *, result: Any = None, exception: BaseException | None = None) -> None:
    """Complete ``future`` unless a shutdown already did (the task's own result may race with it)."""
    try:
        if exception is None:
            future.set_result(result)
        else:
            future.set_exception(exception)
    except InvalidStateError:
        pass


def _check_reachable(address: str) -> None:
    """Fail at once when nothing listens at ``address``: ``ray.init`` would retry for minutes, warning."""
    if "://" in address or address in ("auto", "local"):
        return  # Ray's own forms, resolved by Ray
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise UsageError(f"Ray address {address!r} is not HOST:PORT (e.g. 10.0.0.5:6379)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise UsageError(
            f"cannot reach a Ray cluster at {address}: {exc.strerror or exc}. Start one with "
            "`ray start --head`, or give the address its head node printed"
        ) from exc


def _connect(ray: Any, address: str | None, max_workers: int | None) -> None:
    if address is not None:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        address="local",  # never the last cluster `ray start` left behind: that one is --ray-address's job
        num_cpus=max_workers or os.cpu_count() or 1,
        object_store_memory=LOCAL_OBJECT_STORE_BYTES,
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
    )


_initialized: set[Callable[[], object]] = set()
"""The initializers this worker process has run (Ray reuses a worker for many tasks)."""


def _run_checked(
    visible: tuple[str, ...],
    initializer: Callable[[], object] | None,
    fn: Callable[..., T],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> T:
    """The body of every task: check the paths this node must see, prepare the process once, run ``fn``."""
    check_visible(visible)
    if initializer is not None and initializer not in _initialized:
        initializer()
        _initialized.add(initializer)
    return fn(*args, **kwargs)


def check_visible(paths: Iterable[str]) -> None:
    """Raise :class:`DataError` naming this node and the first of ``paths`` that does not exist here."""
    for path in paths:
        if not os.path.exists(path):
            raise DataError(
                f"{path} does not exist on {node_name()}: every node of the cluster must see SRC and OUT at "
                "the same path (a shared mount), or they must be object-store URLs"
            )


def node_name() -> str:
    """This node as an operator finds it: IP address, host name and, inside Ray, the Ray node id."""
    try:
        import ray

        context: Any = ray.get_runtime_context()
        util: Any = ray.util
        return (
            f"node {util.get_node_ip_address()} (host {socket.gethostname()}, "
            f"Ray node {context.get_node_id()[:12]})"
        )
    except Exception:  # outside a Ray worker
        return f"host {socket.gethostname()}"


def _unwrap(ray: Any, exc: BaseException) -> BaseException:
    """The exception the task raised, with where it ran as a note; Ray's own failures as TaskLostError."""
    exceptions = ray.exceptions
    text = _ANSI.sub("", str(exc)).strip()
    if isinstance(exc, exceptions.RayTaskError):
        cause: object = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            if hasattr(cause, "add_note"):  # Python 3.11+; 3.10 gets the cause without the note
                cause.add_note(f"raised in a Ray task: {text.partition(chr(10))[0]}")
            return cause
        return RuntimeError(text)  # a cause that did not pickle back: its text is all there is
    if isinstance(exc, exceptions.TaskCancelledError):
        return CancelledError(str(exc))
    if isinstance(exc, exceptions.RayError):
        lost = TaskLostError(
            f"a Ray task was lost after {MAX_RETRIES} retries: {text}; "
            "finished shards are kept: rerun with --resume"
        )
        lost.__cause__ = exc
        return lost
    return exc
