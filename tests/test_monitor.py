"""InputMonitor: exact wait accounting on a fake clock; the real clock only as a lower bound."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch

from loaders.monitor import _GATHERED, EpochStats, InputMonitor, _from_row, count_samples, format_line
from loaders.transfer.collate import RaggedBytes


class FakeClock:
    """A clock that only moves when the test says so: exact accounting, no flakiness."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def slow_batches(clock: FakeClock, waits: list[float], batch_size: int = 4) -> Iterator[torch.Tensor]:
    for wait in waits:
        clock.now += wait  # the loader blocks this long before the batch is ready
        yield torch.zeros(batch_size, 3)


def test_wait_compute_and_warmup_accounting_on_a_fake_clock() -> None:
    clock = FakeClock()
    waits = [5.0, 1.0, 2.0, 3.0]
    monitor = InputMonitor(slow_batches(clock, waits), warmup_steps=1, clock=clock, count_bytes=lambda b: 10)
    for _ in monitor:
        with monitor.phase("compute"):
            clock.now += 0.5
        clock.now += 0.25  # unmarked work still belongs to the step
    stats = monitor.last
    assert stats is not None
    assert stats.steps == 3 and stats.samples == 12 and stats.num_bytes == 30
    assert stats.wait_s == pytest.approx(6.0)
    assert stats.step_s == pytest.approx(6.0 + 3 * 0.75)
    assert stats.first_batch_s == pytest.approx(5.0)
    assert stats.wait_fraction == pytest.approx(6.0 / 8.25)
    assert stats.samples_per_s == pytest.approx(12 / 8.25)
    assert monitor.phase_totals() == {"compute": pytest.approx(1.5)}


def test_break_closes_the_open_step_and_a_new_iteration_is_a_new_epoch() -> None:
    clock = FakeClock()
    monitor = InputMonitor(list(range(10)), clock=clock, count=lambda b: 1)
    batches = iter(monitor)
    for index, _ in enumerate(batches):
        clock.now += 1.0
        if index == 2:
            break
    batches.close()
    clock.now += 100.0  # time after the loop is not part of any step
    stats = monitor.end_epoch()
    assert (stats.steps, stats.step_s, stats.wait_s) == (3, 3.0, 0.0)
    assert monitor.epoch == 0
    for _ in monitor:
        pass
    assert monitor.epoch == 1 and monitor.end_epoch().steps == 10


def test_real_clock_with_a_slow_iterable() -> None:
    def slow() -> Iterator[list[int]]:
        for _ in range(4):
            time.sleep(0.03)
            yield [0, 1]

    monitor = InputMonitor(slow())
    for _ in monitor:
        monitor.add("compute", 0.0)
        time.sleep(0.01)
    stats = monitor.end_epoch()
    assert stats.samples == 8
    assert 0.12 <= stats.wait_s <= stats.step_s  # four sleeps of 30 ms are waited at least; no ratio asserted


def test_count_samples_of_common_batch_shapes() -> None:
    ragged = RaggedBytes.from_list([b"a", b"bc", b""])
    assert count_samples(torch.zeros(7, 2)) == 7
    assert count_samples((torch.zeros(5), torch.zeros(5))) == 5
    assert count_samples({"__key__": ["a", "b", "c"], "bin": ragged}) == 3
    assert count_samples({"x": {"y": torch.zeros(2)}}) == 2
    assert count_samples([1, 2]) == 2


def test_summary_line_names_the_slowest_rank_and_the_verdict() -> None:
    def stats(rank: int, wall: float, wait: float) -> EpochStats:
        return EpochStats(rank, 10, 100, 1000, wait, wall, wall, 0.5, 0.0)

    line = format_line(3, [stats(0, 1.0, 0.05), stats(1, 2.0, 0.8)], threshold=0.1)
    assert line.startswith("epoch 3: 150 samples/s over 2 rank(s)")
    assert "input-bound" in line and "slowest rank 1" in line and "wait 40%" in line
    single = InputMonitor([torch.zeros(2)], threshold=0.5)
    for _ in single:
        pass
    assert "rank(s)" in single.summary_line() and "slowest rank 0" in single.summary_line()


def test_a_gathered_row_rebuilds_every_field_of_a_ranks_stats() -> None:
    """The floats one rank sends in ``gather()`` carry all of EpochStats, counts coming back as ints."""
    stats = EpochStats(2, 10, 100, 1000, 0.25, 1.5, 2.0, 0.125, 4096.0)
    rebuilt = _from_row([float(getattr(stats, name)) for name in _GATHERED])
    assert rebuilt == stats
    assert all(isinstance(getattr(rebuilt, name), int) for name in ("rank", "steps", "samples", "num_bytes"))


def test_bad_arguments_are_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match="warmup_steps must be >= 0, got -1"):
        InputMonitor([], warmup_steps=-1)
    with pytest.raises(ValueError, match=r"threshold must be in \[0, 1\], got 2"):
        InputMonitor([], threshold=2)
