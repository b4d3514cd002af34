"""Step-count checks and the epoch guard, on real gloo ranks: errors that name ranks, never a hang."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from loaders.distributed.sync import (
    epoch_barrier,
    guarded,
    validate_dataloader_sync,
)
from testkit.distributed import RankFailedError, RankHangError, run_ranks

pytestmark = pytest.mark.dist

GUARD_TIMEOUT = 2.0  # seconds the guard waits; the tests check that errors arrive soon after it


def _outcome(call: Any) -> dict[str, Any]:
    """Run `call()` in a rank; report its value or its error as JSON-safe data, with the elapsed time."""
    start = time.monotonic()
    try:
        return {"value": call(), "seconds": time.monotonic() - start}
    except Exception as exc:
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "missing": getattr(exc, "missing_ranks", None),
            "counts": getattr(exc, "counts", None),
            "seconds": time.monotonic() - start,
        }


def _stream(num_batches: int) -> Iterator[torch.Tensor]:
    """A loader with no length, like an IterableDataset: only iterating it reveals its count."""
    for index in range(num_batches):
        yield torch.full((2,), float(index))


def _train(loader: Any, timeout: float, check_steps: bool = True) -> int:
    """A training loop's collective pattern: one all-reduce on the default group per batch."""
    steps = 0
    for batch in guarded(loader, timeout, check_steps=check_steps):
        dist.all_reduce(batch)
        steps += 1
    return steps


def _rank_checks(rank: int, world_size: int) -> dict[str, Any]:
    """Every scenario that leaves the group usable, in one run to pay the process start once."""
    short = 9 if rank == 1 else 10  # rank 1 has one batch fewer
    return {
        "equal": _outcome(lambda: validate_dataloader_sync(list(range(10)), GUARD_TIMEOUT)),
        "unequal": _outcome(lambda: validate_dataloader_sync(list(range(short)), GUARD_TIMEOUT)),
        "no_len": _outcome(lambda: validate_dataloader_sync(_stream(3), GUARD_TIMEOUT)),
        "guarded_equal": _outcome(lambda: _train(list(_stream(4)), GUARD_TIMEOUT)),
        "guarded_planned": _outcome(lambda: _train(list(_stream(short)), GUARD_TIMEOUT)),
        # The deadlock counterexample: unequal streams, no length to check up front.
        "guarded_stream": _outcome(lambda: _train(_stream(4 if rank == 1 else 5), GUARD_TIMEOUT)),
        "after": _outcome(lambda: _train(_stream(3), GUARD_TIMEOUT)),  # the group still works
    }


@pytest.fixture(scope="module")
def checks() -> list[dict[str, Any]]:
    return run_ranks(_rank_checks, 3, timeout=45)


@pytest.mark.timeout(60)
def test_equal_counts_pass_and_return_the_count(checks: list[dict[str, Any]]) -> None:
    assert [c["equal"]["value"] for c in checks] == [10, 10, 10]
    assert [c["guarded_equal"]["value"] for c in checks] == [4, 4, 4]
    assert [c["after"]["value"] for c in checks] == [3, 3, 3]


@pytest.mark.timeout(60)
def test_unequal_counts_raise_on_every_rank_naming_all_counts(checks: list[dict[str, Any]]) -> None:
    for check in checks:
        out = check["unequal"]
        assert out["error"] == "StepCountMismatchError"
        assert "rank 0: 10 batches, rank 1: 9 batches, rank 2: 10 batches" in out["message"]
        assert "remainder='pad'" in out["message"]
        assert out["counts"] == [10, 9, 10]
        # guarded() runs the same check before its first batch.
        assert check["guarded_planned"]["error"] == "StepCountMismatchError"


@pytest.mark.timeout(60)
def test_loader_without_length_is_a_clear_error(checks: list[dict[str, Any]]) -> None:
    for check in checks:
        assert check["no_len"]["error"] == "TypeError"
        assert "has no length" in check["no_len"]["message"]


@pytest.mark.timeout(60)
def test_unequal_streams_end_in_an_error_naming_the_short_rank(checks: list[dict[str, Any]]) -> None:
    for check in checks:
        out = check["guarded_stream"]
        assert out["error"] == "StepCountMismatchError"
        assert "rank(s) 1 ran out of batches after 4" in out["message"]
        assert "rank 0: 5+ batches, rank 1: 4 batches, rank 2: 5+ batches" in out["message"]
        assert out["seconds"] < GUARD_TIMEOUT  # caught by agreement, not by waiting out a timeout


def _rank_straggler(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 2 reaches the end of the epoch well after the guard's timeout."""
    epoch_barrier(GUARD_TIMEOUT)  # creates the private gloo group (a collective) while everyone is here

    def late() -> None:
        if rank == 2:
            time.sleep(GUARD_TIMEOUT + 0.5)
        epoch_barrier(GUARD_TIMEOUT)

    return _outcome(late)


@pytest.mark.timeout(60)
def test_barrier_names_the_rank_that_never_arrives() -> None:
    results = run_ranks(_rank_straggler, 3, timeout=30)
    assert results[0]["error"] == "RankTimeoutError"
    assert results[0]["missing"] == [2]
    assert results[0]["message"].startswith("rank(s) 2 did not reach the end of the epoch within 2 s")
    assert results[0]["seconds"] < GUARD_TIMEOUT + 1.5
    # Gloo tells only rank 0 who is missing; the others point to rank 0's report.
    assert results[1]["error"] == "RankTimeoutError"
    assert results[1]["missing"] is None
    assert "rank 0's error names it" in results[1]["message"]


def _rank_unchecked(rank: int, world_size: int) -> dict[str, Any]:
    """The counterexample without the per-step check: rank 1 stops one batch early."""
    return _outcome(lambda: _train(_stream(4 if rank == 1 else 5), GUARD_TIMEOUT, check_steps=False))


@pytest.mark.timeout(60)
def test_without_step_checks_the_short_rank_times_out_and_peers_fail_not_hang() -> None:
    """What the module docstring promises for check_steps=False: the short rank's barrier times out; its
    peers, blocked in the training's all-reduce, fail once it exits (gloo), instead of waiting 30 min."""
    results = run_ranks(_rank_unchecked, 3, timeout=45)
    assert results[1]["error"] == "RankTimeoutError"
    assert "after 4 batches" in results[1]["message"]
    assert results[1]["seconds"] < GUARD_TIMEOUT + 1.5
    for rank in (0, 2):
        assert results[rank]["error"] in ("RuntimeError", "DistBackendError")
        assert "closed" in results[rank]["message"].lower()
        # They fail because rank 1 left, well before their own 45 s process-group timeout.
        assert results[rank]["seconds"] < 20


def _sleep_forever(rank: int, world_size: int) -> None:
    time.sleep(60)


def _rank_fails_or_hangs(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("boom on rank 1")
    time.sleep(60)  # a peer waiting forever for the rank that failed
    return rank


def _rank_hangs(rank: int, world_size: int) -> int:
    if rank == 0:
        time.sleep(60)
    return rank


@pytest.mark.timeout(60)
def test_harness_reraises_a_rank_exception_and_never_hangs() -> None:
    start = time.monotonic()
    with pytest.raises(
        RankFailedError, match=r"(?s)rank 1 raised ValueError.*in _rank_fails_or_hangs.*boom"
    ) as info:
        run_ranks(_rank_fails_or_hangs, 2, timeout=50)
    assert "rank(s) 0 did not finish and were killed" in str(info.value)
    assert time.monotonic() - start < 35  # the failure cut the wait short; 50 s was not waited out


@pytest.mark.timeout(60)
def test_harness_kills_a_hung_rank_and_names_it() -> None:
    start = time.monotonic()
    with pytest.raises(RankHangError, match=r"rank\(s\) 0 did not finish within 7 s"):
        run_ranks(_sleep_forever, 1, timeout=7)
    assert time.monotonic() - start < 12


def test_without_a_process_group_everything_is_local() -> None:
    assert validate_dataloader_sync([1, 2, 3]) == 3
    assert list(guarded(iter([1, 2]), 1.0)) == [1, 2]
    epoch_barrier(1.0)
    with pytest.raises(ValueError, match="timeout must be a positive"):
        epoch_barrier(0)
