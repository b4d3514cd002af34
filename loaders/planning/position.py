"""Where a run stands in its data: the epoch, a loaded resume point, and the pass in progress.

The epoch, the count of ``set_epoch`` calls and the resume point live in shared-memory tensors created
with the dataset, so what the main process sets reaches DataLoader workers whether they are persistent or
not, under fork and spawn, with no named OS resource that a crash could leak.

A pass is complete when every batch planned for it was handed out (``PassProgress``), not when its
consumer pulls ``StopIteration``: trainers stop at ``len(loader)``. The loader that hands the batches out
keeps that count in the main process (it is never read by a worker); the next pass, a ``set_epoch`` or
the saved state then treats the epoch as done, whether or not the consumer asked for more.

The saved state (``encode_state``) is small, JSON-safe and the same on every rank. It names the data
(manifest fingerprint, split, seed, shuffle), the epoch, and the position in the epoch as segments: each
segment is a plan (world size, workers, batch size, ...) and the batches every rank consumed of it
(``loaders.planning.elastic``); no segment means the epoch's start. A state loads on any world size,
worker count and batch size: with the plan of its last segment the pass continues exactly where it
stopped; with another plan the rest of the epoch is re-planned for the new one (``resume_point``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, NamedTuple

import torch

from loaders.planning.elastic import Segment
from loaders.planning.planner import PlanConfig
from loaders.planning.stream import Samples

STATE_VERSION = 2
HISTORY_BYTES = 1 << 16  # the segments of one epoch as JSON: a few hundred bytes each
_EPOCH, _EPOCH_SETS, _PENDING_LENGTH, _LAST_PASS, _WARNED = range(5)


@dataclass(slots=True)
class PassProgress:
    """One loader pass as the main process sees it: where it started and how many batches it handed out."""

    epoch: int
    sets: int  # ``epoch_sets`` when the pass began: a later ``set_epoch`` or load supersedes the pass
    history: tuple[Segment, ...]  # this epoch's segments before the pass's plan
    config: PlanConfig
    batches: int  # batches of the plan handed out, those consumed before a resume included
    planned: int  # batches the plan holds on every rank

    @property
    def complete(self) -> bool:
        return self.batches >= self.planned

    @property
    def length(self) -> int:
        """The epoch's batches as a trainer counts them: those of earlier segments plus this plan's."""
        return sum(segment.batches for segment in self.history) + self.planned


class Position:
    """The epoch and the resume point, shared by the main process and every DataLoader worker, and the
    pass in progress, known to the main process alone."""

    def __init__(self) -> None:
        self._counters = torch.zeros(5, dtype=torch.int64).share_memory_()
        self._pending = torch.zeros(HISTORY_BYTES, dtype=torch.uint8).share_memory_()
        self.progress: PassProgress | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_counters": self._counters, "_pending": self._pending, "progress": None}

    @property
    def epoch(self) -> int:
        return int(self._counters[_EPOCH])

    @property
    def epoch_sets(self) -> int:
        """How many times ``set_epoch`` was called (a load counts): a loader sees a pass begin without one."""
        return int(self._counters[_EPOCH_SETS])

    def current(self) -> PassProgress | None:
        """The pass begun since the last ``set_epoch`` or load, if any (running, complete or abandoned)."""
        progress = self.progress
        return progress if progress is not None and progress.sets == self.epoch_sets else None

    def set_epoch(self, epoch: int) -> None:
        """Moving to another epoch drops a pending resume point, and so does a pass that completed since it
        was loaded; setting the resumed epoch again before that keeps it."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        current = self.current()
        if epoch != self.epoch or (current is not None and current.complete):
            self.finish_pass()
        self._counters[_EPOCH] = epoch
        self._counters[_EPOCH_SETS] += 1

    def pending(self) -> tuple[Segment, ...]:
        """The loaded segments not used up yet: the last one's batches were consumed of its plan."""
        length = int(self._counters[_PENDING_LENGTH])
        raw = bytes(self._pending[:length].numpy()) if length else b"[]"
        return tuple(Segment(PlanConfig(**s["config"]), s["batches"]) for s in json.loads(raw))

    def resume_point(self, config: PlanConfig) -> tuple[PlanConfig, tuple[Segment, ...], int]:
        """``(config, history, batches)`` a pass planned with ``config`` starts from: the pending segments
        continued exactly when the last one's plan is ``config`` (or is ``config`` in an older layout, which
        the pass then keeps), else all of them re-planned; nothing pending: the epoch's start."""
        segments = self.pending()
        if segments and segments[-1].config == replace(config, layout=segments[-1].config.layout):
            return segments[-1].config, segments[:-1], segments[-1].batches
        return config, segments, 0

    def set_resume_point(self, epoch: int, segments: Sequence[Segment]) -> None:
        raw = json.dumps([{"config": asdict(s.config), "batches": s.batches} for s in segments]).encode()
        if len(raw) > HISTORY_BYTES:
            raise ValueError(f"a resume state of {len(segments)} segments does not fit {HISTORY_BYTES} bytes")
        self.finish_pass()
        self.set_epoch(epoch)
        self._pending[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        self._counters[_PENDING_LENGTH] = len(raw)

    def finish_pass(self) -> None:
        """The resumed epoch is used up (or abandoned for another epoch): the next pass starts afresh."""
        self._counters[_PENDING_LENGTH] = 0

    def saved(self) -> tuple[int, tuple[Segment, ...]]:
        """``(epoch, segments)`` a saved state records: the pass in progress, the next epoch's start once
        a pass is complete, or what is pending."""
        current = self.current()
        if current is None:
            return self.epoch, self.pending()
        if current.complete:
            return current.epoch + 1, ()
        return current.epoch, (*current.history, Segment(current.config, current.batches))

    def repeated_pass(self) -> bool:
        """Note a pass that no loader manages (one call per pass, from one process): True once, on the first
        pass that begins without a ``set_epoch`` since the pass before it."""
        sets = self.epoch_sets + 1  # 0 means no pass yet
        again = int(self._counters[_LAST_PASS]) == sets
        self._counters[_LAST_PASS] = sets
        if again and not int(self._counters[_WARNED]):
            self._counters[_WARNED] = 1
            return True
        return False


def segment_to_json(segment: Segment) -> dict[str, Any]:
    config = asdict(segment.config)
    for name in ("seed", "shuffle"):  # the state's identity holds these once
        config.pop(name)
    return {**config, "batches": segment.batches}


def segment_from_json(data: dict[str, Any], *, seed: int = 0, shuffle: bool = True) -> Segment:
    fields = dict(data)
    batches = fields.pop("batches")
    return Segment(PlanConfig(**fields, seed=seed, shuffle=shuffle), batches)


def encode_state(identity: dict[str, Any], epoch: int, segments: Sequence[Segment]) -> dict[str, Any]:
    return {
        "version": STATE_VERSION,
        **identity,
        "epoch": epoch,
        "segments": [segment_to_json(s) for s in segments],
    }


def decode_state(state: dict[str, Any], identity: dict[str, Any]) -> tuple[int, tuple[Segment, ...]]:
    """``(epoch, segments)`` of a saved ``state``; refuses another dataset or seed, naming what differs."""
    if not isinstance(state, dict) or state.get("version") not in (1, STATE_VERSION):
        found = state.get("version") if isinstance(state, dict) else type(state).__name__
        raise ValueError(
            f"cannot resume: found state version {found!r}, expected 1 or {STATE_VERSION}; "
            "pass the dict that state_dict() returned"
        )
    for name in identity:  # manifest, split, seed, shuffle (a mixture adds its own)
        if state.get(name) != identity[name]:
            raise ValueError(
                f"cannot resume: found {name}={state.get(name)!r} in the saved state, expected "
                f"{identity[name]!r} (this loader's). Resume with the same dataset, split, seed and shuffle "
                "as the saved run, or start the epoch afresh without load_state_dict()"
            )
    try:
        segments = tuple(_segment(s, state) for s in _segments_of(state))
        epoch = int(state["epoch"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"cannot resume: the saved state is malformed ({exc!r})") from exc
    if epoch < 0:
        raise ValueError(f"cannot resume: the saved state's epoch is {epoch}, expected an int >= 0")
    return epoch, segments


def _segments_of(state: dict[str, Any]) -> list[dict[str, Any]]:
    if state["version"] == STATE_VERSION:
        return list(state["segments"])
    # Version 1 held one plan's fields at the top level, planned with layout 1.
    names = ("world_size", "num_workers", "batch_size", "remainder", "block_size", "shuffle_buffer")
    return [{**{name: state[name] for name in names}, "layout": 1, "batches": state["batches"]}]


def _segment(data: dict[str, Any], state: dict[str, Any]) -> Segment:
    return segment_from_json(data, seed=state["seed"], shuffle=state["shuffle"])


@dataclass(frozen=True, slots=True)
class WorkerPass:
    """Where one reader stands in its pass: what a DataLoader worker's own state records, for loaders that
    save a state per worker (torchdata's ``StatefulDataLoader``)."""

    epoch: int
    history: tuple[Segment, ...]  # this epoch's segments before the pass's plan
    config: PlanConfig
    worker_index: int
    role: int  # the part of the plan this worker reads (rotated after a rank-level resume)
    samples: int  # samples of that part handed out, those consumed before a resume included


class PassPlan(NamedTuple):
    """One worker's pass: who it is, the epoch, the role it plays after a resume, the plan's config and
    sequence, and the samples of its part already consumed before the resume."""

    worker_index: int
    epoch: int
    role: int
    config: PlanConfig
    runs: Samples
    skip: int


def check_same_worker(saved: WorkerPass, config: PlanConfig, worker_index: int) -> None:
    """A worker's own saved position continues only the same worker of the same plan."""
    if saved.config != config or saved.worker_index != worker_index:
        found = f"worker {saved.worker_index} of {plan_words(saved.config)}"
        expected = f"worker {worker_index} of {plan_words(config)}"
        raise ValueError(
            f"cannot resume: found {found} in the saved worker state, expected {expected} (this loader's). "
            "A worker's own state (torchdata's StatefulDataLoader) resumes with the same world size, "
            "workers and batch size; to resume on another world, save make_loader's loader.state_dict()"
        )


def plan_words(config: PlanConfig) -> str:
    return (
        f"world_size={config.world_size}, num_workers={config.num_workers}, "
        f"batch_size={config.batch_size}, remainder={config.remainder!r}, block_size={config.block_size}, "
        f"shuffle_buffer={config.shuffle_buffer}"
    )


def encode_worker_state(identity: dict[str, Any], where: WorkerPass) -> dict[str, Any]:
    state = encode_state(identity, where.epoch, [*where.history, Segment(where.config, 0)])
    return {**state, "worker": {"index": where.worker_index, "role": where.role, "samples": where.samples}}


def decode_worker_state(state: dict[str, Any], identity: dict[str, Any]) -> WorkerPass:
    """A worker state (``encode_worker_state``) back; refuses another dataset or seed, naming what differs."""
    epoch, segments = decode_state(state, identity)
    try:
        worker = state["worker"]
        index, role, samples = (int(worker[name]) for name in ("index", "role", "samples"))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"cannot resume: the saved worker state is malformed ({exc!r})") from exc
    if not segments or min(index, role, samples) < 0:
        raise ValueError(f"cannot resume: the saved worker state is malformed ({state.get('worker')!r})")
    return WorkerPass(epoch, segments[:-1], segments[-1].config, index, role, samples)
