"""Where a run stands in its data: the epoch, and the point a resumed pass starts from.

The epoch, the count of ``set_epoch`` calls and the resume point live in shared-memory tensors created
with the dataset, so what the main process sets reaches DataLoader workers whether they are persistent or
not, under fork and spawn, with no named OS resource that a crash could leak.

The saved state (``encode_state``) is small, JSON-safe and the same on every rank. It names the data
(manifest fingerprint, split, seed, shuffle), the epoch, and the position in the epoch as segments: each
segment is a plan (world size, workers, batch size, ...) and the batches every rank consumed of it
(``loaders.planning.elastic``). A state loads on any world size, worker count and batch size: with the
plan of its last segment the pass continues exactly where it stopped; with another plan the rest of the epoch
is re-planned for the new one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch

from loaders.planning.elastic import Segment
from loaders.planning.planner import PlanConfig

STATE_VERSION = 2
HISTORY_BYTES = 1 << 16  # the segments of one epoch as JSON: a few hundred bytes each
_EPOCH, _EPOCH_SETS, _SKIP, _HISTORY_LENGTH = range(4)


class Position:
    """The epoch and the resume point, shared by the main process and every DataLoader worker."""

    def __init__(self) -> None:
        self._counters = torch.zeros(4, dtype=torch.int64).share_memory_()
        self._history = torch.zeros(HISTORY_BYTES, dtype=torch.uint8).share_memory_()

    @property
    def epoch(self) -> int:
        return int(self._counters[_EPOCH])

    @property
    def epoch_sets(self) -> int:
        """How many times ``set_epoch`` was called: lets a loader see a pass begin without one."""
        return int(self._counters[_EPOCH_SETS])

    def set_epoch(self, epoch: int) -> None:
        """Moving to another epoch drops a pending resume point; setting the resumed epoch keeps it."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        if epoch != self.epoch:
            self.finish_pass()
        self._counters[_EPOCH] = epoch
        self._counters[_EPOCH_SETS] += 1

    def resume_point(self) -> tuple[tuple[Segment, ...], int]:
        """``(history, batches)``: this epoch's earlier segments, and batches of the plan already consumed."""
        length = int(self._counters[_HISTORY_LENGTH])
        raw = bytes(self._history[:length].numpy()) if length else b"[]"
        history = tuple(Segment(PlanConfig(**s["config"]), s["batches"]) for s in json.loads(raw))
        return history, int(self._counters[_SKIP])

    def set_resume_point(self, epoch: int, history: Sequence[Segment], batches: int) -> None:
        raw = json.dumps([{"config": asdict(s.config), "batches": s.batches} for s in history]).encode()
        if len(raw) > HISTORY_BYTES:
            raise ValueError(f"a resume state of {len(history)} segments does not fit {HISTORY_BYTES} bytes")
        self.set_epoch(epoch)
        self._history[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        self._counters[_HISTORY_LENGTH] = len(raw)
        self._counters[_SKIP] = batches

    def finish_pass(self) -> None:
        """The resumed pass is complete (or abandoned for another epoch): the next pass starts afresh."""
        self._counters[_SKIP] = 0
        self._counters[_HISTORY_LENGTH] = 0


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


def decode_state(
    state: dict[str, Any], identity: dict[str, Any], config: PlanConfig
) -> tuple[int, tuple[Segment, ...], int]:
    """``(epoch, history, batches)`` to resume ``state`` with ``config``; refuses another dataset or seed."""
    if not isinstance(state, dict) or state.get("version") not in (1, STATE_VERSION):
        found = state.get("version") if isinstance(state, dict) else type(state).__name__
        raise ValueError(
            f"cannot resume: found state version {found!r}, expected 1 or {STATE_VERSION}; "
            "pass the dict that loader.state_dict() returned"
        )
    for name in identity:  # manifest, split, seed, shuffle (a mixture adds its own)
        if state.get(name) != identity[name]:
            raise ValueError(
                f"cannot resume: found {name}={state.get(name)!r} in the saved state, expected "
                f"{identity[name]!r} (this loader's). Resume with the same dataset, split, seed and shuffle "
                "as the saved run, or start the epoch afresh without load_state_dict()"
            )
    try:
        segments = [_segment(s, state) for s in _segments_of(state)]
        epoch = int(state["epoch"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"cannot resume: the saved state is malformed ({exc!r})") from exc
    if not segments:
        raise ValueError("cannot resume: the saved state holds no segment")
    last = segments[-1]
    if last.config == config:
        return epoch, tuple(segments[:-1]), last.batches  # the same plan: continue it exactly
    return epoch, tuple(segments), 0  # another plan: re-plan the rest of the epoch


def _segments_of(state: dict[str, Any]) -> list[dict[str, Any]]:
    if state["version"] == STATE_VERSION:
        return list(state["segments"])
    # Version 1 held one plan's fields at the top level, planned with layout 1.
    names = ("world_size", "num_workers", "batch_size", "remainder", "block_size", "shuffle_buffer")
    return [{**{name: state[name] for name in names}, "layout": 1, "batches": state["batches"]}]


def _segment(data: dict[str, Any], state: dict[str, Any]) -> Segment:
    return segment_from_json(data, seed=state["seed"], shuffle=state["shuffle"])
