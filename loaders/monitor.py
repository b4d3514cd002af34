"""Input-wait instrument for any training loop: is this run input-bound or compute-bound?

``InputMonitor`` wraps an iterable of batches. A step runs from the moment the loop asks for a batch to
the moment it asks for the next one; its data wait is the part spent blocked in ``next()``. The caller may
time parts of the step (``with monitor.phase("copy"): ...``, or ``monitor.add("compute", seconds)`` for
CUDA-event timings); whatever is not marked is still in the step time. The first ``warmup_steps`` steps of
every epoch are excluded from the epoch's numbers (the first one's wait is kept as first-batch latency).

Over a ``Mixture``'s loader it also counts each source's real samples per epoch (the batches'
``__source__``, pads left out; ``EpochStats.source_counts``), and the line adds them with each source's
pass and position after the epoch.

``summary_line()`` gathers each rank's numbers (one all_gather of a small float tensor when
torch.distributed is initialized, so every rank must call it) and returns one line naming the slowest rank.

Public: :class:`InputMonitor` (also ``loaders.InputMonitor``) and :class:`EpochStats`, what ``gather()``
returns per rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any, Generic, TypeVar

import torch

from loaders.distributed.world import get_world

__all__ = ["EpochStats", "InputMonitor"]

T = TypeVar("T")
Clock = Callable[[], float]


@dataclass(slots=True)
class Step:
    """One step's wall-clock split: data wait, marked phases, and the whole step."""

    wait_s: float
    samples: int
    num_bytes: int
    step_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    sources: list[int] = field(default_factory=list)  # a mixture's real samples per source


@dataclass(frozen=True, slots=True)
class EpochStats:
    """One rank's numbers for one epoch, warm-up steps excluded (first_batch_s is the first step's wait)."""

    rank: int
    steps: int
    samples: int
    num_bytes: int
    wait_s: float
    step_s: float
    wall_s: float
    first_batch_s: float
    peak_gpu: float  # bytes, torch.cuda.max_memory_allocated; 0 without CUDA
    source_counts: tuple[int, ...] = ()  # a mixture's real (not pad) samples per source, in its names' order

    @property
    def wait_fraction(self) -> float:
        return self.wait_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0


# The floats gathered over ranks, in this order; EpochStats is rebuilt from them on every rank.
_GATHERED = tuple(f.name for f in fields(EpochStats) if f.name != "source_counts")


def count_samples(batch: Any) -> int:
    """Batch size of a tensor, a sequence, or a dict / tuple whose first sized entry is the batch."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, dict):
        batch = next((v for v in batch.values() if hasattr(v, "__len__") and not isinstance(v, str)), [])
        return count_samples(batch) if isinstance(batch, dict | tuple | torch.Tensor) else len(batch)
    if isinstance(batch, tuple) and batch:
        return count_samples(batch[0])
    return len(batch)


class InputMonitor(Generic[T]):
    """Iterate ``batches`` while timing data wait per step; one iteration of the monitor = one epoch."""

    def __init__(
        self,
        batches: Iterable[T],
        *,
        warmup_steps: int = 0,
        count: Callable[[T], int] = count_samples,
        count_bytes: Callable[[T], int] | None = None,
        threshold: float = 0.1,
        clock: Clock = time.perf_counter,
    ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        self.batches, self.warmup_steps, self.threshold = batches, warmup_steps, threshold
        self._count, self._count_bytes, self._clock = count, count_bytes, clock
        self.steps: list[Step] = []
        self.epoch = -1
        self.last: EpochStats | None = None
        self._step_start: float | None = None
        mixture = getattr(batches, "sharded", None)  # a ShardedLoader over a Mixture: count per source
        self.source_names: tuple[str, ...] = tuple(getattr(mixture, "names", ()))
        self._mixture = mixture if self.source_names else None

    def __iter__(self) -> Generator[T, None, None]:
        self.epoch += 1
        self.steps, self.last, self._step_start = [], None, None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()
        iterator: Iterator[T] | None = None
        try:
            while True:
                start = self._clock()
                self._close_step(start)
                try:
                    if iterator is None:  # a DataLoader starts its workers here: part of the first wait
                        iterator = iter(self.batches)
                    batch = next(iterator)
                except StopIteration:
                    return
                waited = self._clock() - start
                num_bytes = self._count_bytes(batch) if self._count_bytes else 0
                self.steps.append(Step(waited, self._count(batch), num_bytes, sources=self._sources(batch)))
                self._step_start = start
                yield batch
        finally:  # also on break / close(): the open step ends now
            self.end_epoch()

    def _sources(self, batch: Any) -> list[int]:
        """Real samples per source of a mixture's batch (its ``__source__`` column, pads left out)."""
        if not self.source_names or not isinstance(batch, dict) or "__source__" not in batch:
            return []
        source = torch.as_tensor(batch["__source__"]).reshape(-1)
        pads = batch.get("__pad__")
        if isinstance(pads, torch.Tensor):
            source = source[~pads.reshape(-1).to(torch.bool)]
        return torch.bincount(source, minlength=len(self.source_names)).tolist()

    def _close_step(self, now: float) -> None:
        if self._step_start is not None and self.steps:
            self.steps[-1].step_s = now - self._step_start
        self._step_start = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a part of the current step (e.g. ``copy``, ``compute``) on the wall clock."""
        start = self._clock()
        try:
            yield
        finally:
            self.add(name, self._clock() - start)

    def add(self, name: str, seconds: float) -> None:
        """Add ``seconds`` measured elsewhere (e.g. CUDA events) to a phase of the current step."""
        if self.steps:
            phases = self.steps[-1].phases
            phases[name] = phases.get(name, 0.0) + seconds

    def end_epoch(self) -> EpochStats:
        """Close the open step and compute this rank's epoch numbers (idempotent)."""
        self._close_step(self._clock())
        self.last = self._stats()
        return self.last

    def _stats(self) -> EpochStats:
        measured = self.steps[self.warmup_steps :]
        peak = 0.0
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            peak = float(torch.cuda.max_memory_allocated())
        step_s = sum(s.step_s for s in measured)
        return EpochStats(
            rank=get_world()[0],
            steps=len(measured),
            samples=sum(s.samples for s in measured),
            num_bytes=sum(s.num_bytes for s in measured),
            wait_s=sum(s.wait_s for s in measured),
            step_s=step_s,
            wall_s=step_s,  # measured steps are back to back: the window's wall time is their sum
            first_batch_s=self.steps[0].wait_s if self.steps else 0.0,
            peak_gpu=peak,
            source_counts=self._source_counts(),
        )

    def _source_counts(self) -> tuple[int, ...]:
        """Per-source real samples over the whole epoch (warm-up steps included: composition, not speed)."""
        totals = [0] * len(self.source_names)
        for step in self.steps:
            for i, n in enumerate(step.sources):
                totals[i] += n
        return tuple(totals)

    def phase_totals(self) -> dict[str, float]:
        """Seconds per marked phase over the measured (post-warm-up) steps of the current epoch."""
        totals: dict[str, float] = {}
        for step in self.steps[self.warmup_steps :]:
            for name, seconds in step.phases.items():
                totals[name] = totals.get(name, 0.0) + seconds
        return totals

    def gather(self) -> list[EpochStats]:
        """Every rank's EpochStats (a collective when torch.distributed is initialized)."""
        mine = self.end_epoch()
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return [mine]
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        local = torch.tensor([float(getattr(mine, n)) for n in _GATHERED], dtype=torch.float64, device=device)
        local = torch.cat([local, torch.tensor(mine.source_counts, dtype=torch.float64, device=device)])
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local)
        width = len(_GATHERED)
        return [
            replace(
                _from_row(p.cpu().tolist()[:width]), source_counts=tuple(int(v) for v in p[width:].tolist())
            )
            for p in parts
        ]

    def summary_line(self) -> str:
        """One line for the epoch over all ranks: throughput, wait fraction, verdict, slowest rank."""
        ranks = self.gather()
        line = format_line(self.epoch, ranks, self.threshold)
        if self._mixture is not None:
            totals = [sum(column) for column in zip(*(s.source_counts for s in ranks), strict=True)]
            after = self._mixture.state_extras(self._mixture.epoch + 1)["sources"]
            line += "; " + source_line(self.source_names, totals, after)
        return line


def _from_row(row: list[float]) -> EpochStats:
    values = dict(zip(_GATHERED, row, strict=True))
    ints = {"rank", "steps", "samples", "num_bytes"}
    return EpochStats(**{n: int(v) if n in ints else v for n, v in values.items()})  # type: ignore[arg-type]


def format_line(epoch: int, ranks: list[EpochStats], threshold: float) -> str:
    """One line: the epoch, samples per second over all ranks, the worst wait fraction, the slowest rank."""
    slowest = max(ranks, key=lambda s: (s.wall_s / max(s.samples, 1), s.rank))
    total = sum(s.samples_per_s for s in ranks)
    worst = max(s.wait_fraction for s in ranks)
    verdict = "input-bound" if worst > threshold else "compute-bound"
    line = (
        f"epoch {epoch}: {total:,.0f} samples/s over {len(ranks)} rank(s), "
        f"data wait {worst:.0%} of step time (max over ranks; "
        f"{verdict} at threshold {threshold:.0%}), first batch {slowest.first_batch_s:.2f} s"
    )
    if any(s.num_bytes for s in ranks):
        line += f", {sum(s.num_bytes / max(s.wall_s, 1e-12) for s in ranks) / 1e6:,.1f} MB/s"
    if any(s.peak_gpu for s in ranks):
        line += f", peak GPU memory {max(s.peak_gpu for s in ranks) / 2**30:.2f} GiB"
    line += (
        f"; slowest rank {slowest.rank} ({slowest.samples_per_s:,.0f} samples/s, "
        f"wait {slowest.wait_fraction:.0%})"
    )
    return line


def source_line(names: tuple[str, ...], totals: list[int], after: dict[str, dict[str, int]]) -> str:
    """A mixture's part of the line: real samples per source over all ranks, and each source's pass and
    position once the epoch is complete."""
    parts = [
        f"{name} {total:,} (pass {after[name]['pass']} at {after[name]['position']:,})"
        for name, total in zip(names, totals, strict=True)
    ]
    return "per source " + ", ".join(parts)
