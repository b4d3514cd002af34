"""The shared position and the saved state: round trips, version 1 states, refusals that say what to do."""

from __future__ import annotations

import json

import pytest

from loaders.planning.elastic import Segment
from loaders.planning.planner import PlanConfig
from loaders.planning.position import Position, decode_state, encode_state

IDENTITY = {"manifest": "abc", "split": "train", "seed": 7, "shuffle": True}
CONFIG = PlanConfig(2, 2, seed=7, batch_size=4)


def test_resume_point_round_trips_every_field_through_shared_memory() -> None:
    position = Position()
    history = (Segment(PlanConfig(3, 1, seed=7, shuffle=False, batch_size=5, block_size=2, layout=1), 4),)
    position.set_resume_point(3, history, 2)
    assert position.resume_point() == (history, 2)
    assert position.epoch == 3
    position.set_epoch(3)  # the same epoch again keeps the resume point
    assert position.resume_point() == (history, 2)
    position.set_epoch(4)  # another epoch drops it
    assert position.resume_point() == ((), 0)
    assert position.epoch_sets == 3


def test_state_continues_the_same_plan_or_replans_another() -> None:
    earlier = Segment(PlanConfig(4, 0, seed=7, batch_size=2), 3)
    state = json.loads(json.dumps(encode_state(IDENTITY, 5, [earlier, Segment(CONFIG, 6)])))
    assert decode_state(state, IDENTITY, CONFIG) == (5, (earlier,), 6)
    other = PlanConfig(3, 2, seed=7, batch_size=4)
    assert decode_state(state, IDENTITY, other) == (5, (earlier, Segment(CONFIG, 6)), 0)


def test_version_one_states_load_with_the_earlier_layout() -> None:
    old = {"version": 1, **IDENTITY, "world_size": 2, "num_workers": 2, "batch_size": 4, "remainder": "pad",
           "shuffle_buffer": 1024, "block_size": 256, "epoch": 1, "batches": 3}  # fmt: skip
    layout_one = PlanConfig(2, 2, seed=7, batch_size=4, block_size=256, layout=1)
    assert decode_state(old, IDENTITY, CONFIG) == (1, (Segment(layout_one, 3),), 0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": 8}, "found seed=8 in the saved state, expected 7"),
        ({"manifest": "zzz"}, "found manifest='zzz'"),
        ({"version": 9}, "found state version 9"),
        ({"segments": []}, "holds no segment"),
        ({"segments": [{"world_size": 2}]}, "malformed"),
    ],
)
def test_refusals_say_what_differs(change: dict[str, object], message: str) -> None:
    state = {**encode_state(IDENTITY, 0, [Segment(CONFIG, 1)]), **change}
    with pytest.raises(ValueError, match=message):
        decode_state(state, IDENTITY, CONFIG)
