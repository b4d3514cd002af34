"""Map functions for the pack tests: module-level, so worker processes and Ray tasks import them."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

Sample = dict[str, Any]
MARKS_ENV = "SHARDPIPE_TEST_MARKS"
"""A folder where the slow maps leave one empty file named after each process that ran them."""
SLOW_MAP_S = 0.005


def unchanged(sample: Sample) -> Sample:
    return sample


def twice(sample: Sample) -> list[Sample]:
    """One input becoming two, each with its own key."""
    return [{**sample, "__key__": f"{sample['__key__']}_{part}"} for part in ("a", "b")]


def drop_odd(sample: Sample) -> Sample | None:
    return None if int(sample["__key__"].rsplit("/", 1)[-1]) % 2 else sample


def fail_on_sevens(sample: Sample) -> Sample:
    if sample["__key__"].endswith("7"):
        raise ValueError(f"no sevens please ({len(sample['bin'])} bytes)")
    return sample


def grow(sample: Sample) -> Sample:
    """Outputs larger than their inputs: the shard limits count what the map returns."""
    return {**sample, "bin": sample["bin"] * 3}


def text_not_bytes(sample: Sample) -> Sample:
    return {**sample, "txt": "a str"}


def bad_key(sample: Sample) -> Sample:
    return {**sample, "__key__": sample["__key__"] + ".v2"}


def same_key(sample: Sample) -> Sample:
    return {**sample, "__key__": "one/key"}


def odd_fields(sample: Sample) -> Sample:
    return {**sample, "extra": b"1"} if sample["__key__"].endswith("3") else sample


def make_item(item: int) -> Sample | list[Sample] | None:
    """A sample made from an item (no file behind it): item 3 gives two, every tenth none."""
    if item % 10 == 9:
        return None
    sample = {
        "__key__": f"items/{item:05d}",
        "bin": bytes([item % 256]) * (50 + item % 13),
        "cls": b"%d" % (item % 4),
    }
    if item == 3:
        return [sample, {**sample, "__key__": "items/00003_extra"}]
    return sample


def fail_on_item_seven(item: int) -> Sample:
    if item == 7:
        raise RuntimeError("item seven cannot be made")
    return {"__key__": f"items/{item:05d}", "bin": b"x" * 10}


def changed_in_place(sample: Sample) -> Sample:
    """Returns the dict it was given, changed: still checked."""
    sample["txt"] = "a str"
    return sample


def _mark_and_pause() -> None:
    folder = os.environ.get(MARKS_ENV)
    if folder:
        (Path(folder) / str(os.getpid())).touch()
    time.sleep(SLOW_MAP_S)


def slow(sample: Sample) -> Sample:
    """The sample unchanged, after a pause: a pack that can be killed in the middle of its map."""
    _mark_and_pause()
    return sample


def slow_item(item: int) -> Sample | list[Sample] | None:
    """``make_item`` after a pause."""
    _mark_and_pause()
    return make_item(item)
