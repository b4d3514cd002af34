"""The shared position and the saved state: round trips, completion by count, version 1 states, worker
states, refusals that say what to do."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from loaders.planning.elastic import Segment
from loaders.planning.planner import PlanConfig
from loaders.planning.position import (
    PassProgress,
    Position,
    WorkerPass,
    decode_state,
    decode_worker_state,
    encode_state,
    encode_worker_state,
)

IDENTITY = {"manifest": "abc", "split": "train", "seed": 7, "shuffle": True}
CONFIG = PlanConfig(2, 2, seed=7, batch_size=4)


def test_resume_point_round_trips_every_field_through_shared_memory() -> None:
    position = Position()
    earlier = Segment(PlanConfig(3, 1, seed=7, shuffle=False, batch_size=5, block_size=2, layout=1), 4)
    position.set_resume_point(3, (earlier, Segment(CONFIG, 2)))
    assert position.resume_point(CONFIG) == (CONFIG, (earlier,), 2)  # the last plan again: continued exactly
    assert position.epoch == 3
    position.set_epoch(3)  # the same epoch again keeps the resume point
    assert position.resume_point(CONFIG) == (CONFIG, (earlier,), 2)
    position.set_epoch(4)  # another epoch drops it
    assert position.resume_point(CONFIG) == (CONFIG, (), 0)
    assert position.epoch_sets == 3


def test_another_plan_replans_every_saved_segment() -> None:
    position = Position()
    saved = (Segment(PlanConfig(4, 0, seed=7, batch_size=2), 3), Segment(CONFIG, 6))
    position.set_resume_point(5, saved)
    other = PlanConfig(3, 2, seed=7, batch_size=4)
    assert position.resume_point(other) == (other, saved, 0)
    assert position.resume_point(CONFIG) == (CONFIG, saved[:1], 6)


def test_a_state_of_an_older_layout_continues_in_it() -> None:
    """The same plan saved in layout 2 continues exactly in layout 2 (states saved before layout 3)."""
    position = Position()
    old = replace(CONFIG, layout=2)
    position.set_resume_point(1, (Segment(old, 3),))
    assert position.resume_point(CONFIG) == (old, (), 3)
    assert position.resume_point(replace(CONFIG, batch_size=2)) == (
        replace(CONFIG, batch_size=2),
        (Segment(old, 3),),
        0,
    )


def test_a_pass_is_complete_when_its_planned_batches_are_handed_out() -> None:
    """The saved state follows the pass: its position while it runs, the next epoch's start once complete;
    a set_epoch after a complete pass drops the resume point even for the same epoch."""
    position = Position()
    position.set_resume_point(2, (Segment(CONFIG, 3),))
    _, history, batches = position.resume_point(CONFIG)
    progress = PassProgress(2, position.epoch_sets, history, CONFIG, batches, planned=5)
    position.progress = progress
    assert position.saved() == (2, (Segment(CONFIG, 3),))
    progress.batches += 1
    assert position.saved() == (2, (Segment(CONFIG, 4),))
    progress.batches += 1
    assert progress.complete and position.saved() == (3, ())
    position.set_epoch(2)  # the resumed epoch again, after it completed: a fresh epoch 2
    assert position.resume_point(CONFIG) == (CONFIG, (), 0)
    assert position.current() is None and position.saved() == (2, ())


def test_a_state_saved_at_an_epoch_start_holds_no_segment() -> None:
    state = json.loads(json.dumps(encode_state(IDENTITY, 4, [])))
    assert decode_state(state, IDENTITY) == (4, ())


def test_state_round_trips_its_segments() -> None:
    earlier = Segment(PlanConfig(4, 0, seed=7, batch_size=2), 3)
    state = json.loads(json.dumps(encode_state(IDENTITY, 5, [earlier, Segment(CONFIG, 6)])))
    assert decode_state(state, IDENTITY) == (5, (earlier, Segment(CONFIG, 6)))


def test_version_one_states_load_with_the_earlier_layout() -> None:
    old = {"version": 1, **IDENTITY, "world_size": 2, "num_workers": 2, "batch_size": 4, "remainder": "pad",
           "shuffle_buffer": 1024, "block_size": 256, "epoch": 1, "batches": 3}  # fmt: skip
    layout_one = PlanConfig(2, 2, seed=7, batch_size=4, block_size=256, layout=1)
    assert decode_state(old, IDENTITY) == (1, (Segment(layout_one, 3),))


def test_a_worker_state_round_trips() -> None:
    where = WorkerPass(3, (Segment(PlanConfig(4, 0, seed=7), 2),), CONFIG, 1, 0, 17)
    state = json.loads(json.dumps(encode_worker_state(IDENTITY, where)))
    assert decode_worker_state(state, IDENTITY) == where
    with pytest.raises(ValueError, match="worker state is malformed"):
        decode_worker_state({**state, "worker": {"index": 1}}, IDENTITY)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": 8}, "found seed=8 in the saved state, expected 7"),
        ({"manifest": "zzz"}, "found manifest='zzz'"),
        ({"version": 9}, "found state version 9"),
        ({"epoch": -1}, "epoch is -1"),
        ({"segments": [{"world_size": 2}]}, "malformed"),
    ],
)
def test_refusals_say_what_differs(change: dict[str, object], message: str) -> None:
    state = {**encode_state(IDENTITY, 0, [Segment(CONFIG, 1)]), **change}
    with pytest.raises(ValueError, match=message):
        decode_state(state, IDENTITY)
