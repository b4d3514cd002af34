"""Run a function on N real processes joined in a gloo process group, and never hang doing it.

`run_ranks(fn, world_size, *args)` spawns one process per rank, each joins a gloo group rendezvoused through a
FileStore in a fresh temporary directory (no port to race for), calls `fn(rank, world_size, *args)`, destroys
the group and writes its JSON result to a file. The test process waits at most `timeout` seconds in total
(process start included), kills whatever is still alive and says which ranks those were. An exception in a
rank is re-raised here with that rank's traceback text; once a rank failed, the others get a few seconds to
report (their peers are usually stuck waiting for it), then are killed. `fn` must be a module-level
function: ranks are spawned, so it travels by name.

Start cost is an interpreter plus `import torch` per rank (about 2 s on a small CI box), so callers should run
several scenarios inside one `fn` rather than one `run_ranks` per assertion.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

#: Seconds a rank's process gets to exit after it wrote its result (interpreter and gloo teardown).
_EXIT_GRACE_S = 10.0
#: Seconds the other ranks get once one rank failed: its peers are usually stuck waiting for it.
_FAIL_GRACE_S = 5.0


class RankFailedError(RuntimeError):
    """A rank raised; the message carries its traceback text, `results` what every rank reported."""

    def __init__(self, rank: int, exc_type: str, trace: str, results: dict[int, Any], killed: list[int]):
        note = f"\n(rank(s) {', '.join(map(str, killed))} did not finish and were killed)" if killed else ""
        super().__init__(f"rank {rank} raised {exc_type}:\n{trace}{note}")
        self.rank = rank
        self.exc_type = exc_type
        self.trace = trace
        self.results = results


class RankHangError(RuntimeError):
    """Ranks did not finish within the harness timeout and were killed."""

    def __init__(self, ranks: list[int], timeout: float, results: dict[int, Any]):
        names = ", ".join(str(r) for r in ranks)
        super().__init__(f"rank(s) {names} did not finish within {timeout:g} s and were killed")
        self.ranks = ranks
        self.results = results


def _rank_main(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    store_path: str,
    out_dir: str,
    timeout: float,
    args: tuple,
) -> None:
    """Entry point of one spawned rank: join the group, run `fn`, write `{rank}.json` atomically."""
    if sys.platform.startswith("linux"):
        # Gloo otherwise picks the interface its hostname resolves to, which in containers may be unroutable.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.distributed as dist

    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{store_path}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout),
        )
        outcome: dict[str, Any] = {"ok": True, "result": fn(rank, world_size, *args)}
        json.dumps(outcome)  # fail here, with this rank's traceback, if the result is not JSON-safe
    except BaseException as exc:
        outcome = {"ok": False, "type": type(exc).__name__, "trace": traceback.format_exc()}
    tmp = Path(out_dir) / f"{rank}.json.tmp"
    tmp.write_text(json.dumps(outcome))
    tmp.replace(Path(out_dir) / f"{rank}.json")
    if outcome["ok"] and dist.is_initialized():
        dist.destroy_process_group()
    # After a failure the group may be wedged; skip teardown so the process cannot hang on its way out.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 60.0) -> list[Any]:
    """Run `fn(rank, world_size, *args)` on `world_size` gloo ranks; return the results in rank order.

    The process group's own timeout is `timeout` too, so a collective that cannot complete fails inside the
    rank before the harness has to kill it.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="shardpipe-ranks-") as tmp:
        store_path = str(Path(tmp) / "store")
        procs = [
            ctx.Process(
                target=_rank_main,
                args=(fn, rank, world_size, store_path, tmp, timeout, args),
                name=f"rank{rank}",
                daemon=False,  # ranks start DataLoader workers; the harness kills leftovers itself
            )
            for rank in range(world_size)
        ]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + timeout
        results: dict[int, Any] = {}
        try:
            _wait(procs, tmp, deadline, results)
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                proc.join(5.0)
        missing = [rank for rank in range(world_size) if rank not in results]
        failed = [rank for rank, out in sorted(results.items()) if not out["ok"]]
        if failed:
            first = results[failed[0]]
            raise RankFailedError(failed[0], first["type"], first["trace"], results, missing)
        if missing:
            raise RankHangError(missing, timeout, results)
        return [results[rank]["result"] for rank in range(world_size)]


def _wait(procs: list[Any], out_dir: str, deadline: float, results: dict[int, Any]) -> None:
    """Collect result files until every rank reported and exited, or the deadline passes."""
    exited_at: dict[int, float] = {}
    failed_at: float | None = None
    while True:
        now = time.monotonic()
        for rank, proc in enumerate(procs):
            path = Path(out_dir) / f"{rank}.json"
            if rank not in results and path.exists():
                results[rank] = json.loads(path.read_text())
            if rank not in exited_at and (rank in results or not proc.is_alive()):
                exited_at[rank] = now
        if failed_at is None and any(not out["ok"] for out in results.values()):
            failed_at = now
        done = all(not p.is_alive() for p in procs)
        if done or now >= deadline or (failed_at is not None and now - failed_at > _FAIL_GRACE_S):
            return
        # A rank that reported may linger in interpreter teardown; do not let that eat the whole timeout.
        if len(results) == len(procs) and all(now - exited_at[r] > _EXIT_GRACE_S for r in results):
            return
        for rank, proc in enumerate(procs):
            path = Path(out_dir) / f"{rank}.json"
            if not proc.is_alive() and rank not in results and not path.exists():
                # Died without writing a result (segfault, os._exit in fn): report it, do not wait for it.
                results[rank] = {
                    "ok": False,
                    "type": "ProcessDied",
                    "trace": f"rank {rank} exited with code {proc.exitcode} without reporting a result",
                }
        time.sleep(0.02)
