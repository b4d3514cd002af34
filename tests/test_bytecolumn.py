"""Byte columns: gathered spans, permutations and batches equal what slicing one value at a time gives."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardpipe.formats import bytecolumn

Case = tuple[bytes, np.ndarray, np.ndarray, np.ndarray | None]


@st.composite
def spans_in_a_buffer(draw: st.DrawFn) -> Case:
    """A buffer and spans in it: ascending with gaps (as readers lay fields out) or in any order, some
    empty, and sometimes a mask of present values."""
    buffer = draw(st.binary(min_size=0, max_size=200))
    count = draw(st.integers(0, 12))
    cuts = sorted(draw(st.lists(st.integers(0, len(buffer)), min_size=2 * count, max_size=2 * count)))
    starts, stops = np.array(cuts[0::2], np.int64), np.array(cuts[1::2], np.int64)
    if draw(st.booleans()):  # any order, overlapping: the one-by-one path
        order = np.array(draw(st.permutations(range(count))), np.int64)
        starts, stops = starts[order], stops[order]
    present = np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)), bool)
    return buffer, starts, stops, present if draw(st.booleans()) else None


@settings(max_examples=300, deadline=None)
@given(spans_in_a_buffer())
def test_gather_gives_each_span_or_null(
    case: tuple[bytes, np.ndarray, np.ndarray, np.ndarray | None],
) -> None:
    buffer, starts, stops, present = case
    expected = [
        buffer[a:b] if present is None or present[i] else None
        for i, (a, b) in enumerate(zip(starts.tolist(), stops.tolist(), strict=True))
    ]
    assert bytecolumn.values(bytecolumn.gather(buffer, starts, stops, present)) == expected
    assert bytecolumn.values(bytecolumn.gather(memoryview(buffer), starts, stops, present)) == expected


def test_gather_refuses_spans_outside_the_buffer() -> None:
    buffer = b"0123456789"
    for starts, stops in (([0, 8], [4, 11]), ([-1], [2]), ([5], [4])):
        with pytest.raises(ValueError, match="outside a buffer of 10 bytes"):
            bytecolumn.gather(buffer, np.array(starts), np.array(stops))
    # a missing value's span is never read, whatever it says
    missing = bytecolumn.gather(buffer, np.array([0, -5]), np.array([2, 99]), np.array([True, False]))
    assert bytecolumn.values(missing) == [b"01", None]


def test_texts_decode_utf8_and_refuse_what_is_not() -> None:
    keys = ["a/1", "é/2", "", "日本/3"]
    raw = b"".join(key.encode() for key in keys)
    stops = np.cumsum([len(key.encode()) for key in keys])
    assert bytecolumn.texts(b"xx" + raw, stops - [len(k.encode()) for k in keys] + 2, stops + 2) == keys
    assert bytecolumn.texts(b"ok\xff", np.array([0, 2]), np.array([2, 3])) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.binary(max_size=20)), max_size=30),
    st.data(),
)
def test_take_concat_and_ragged_agree_with_lists(items: list[bytes | None], data: st.DataObject) -> None:
    col = bytecolumn.column(items)
    order = data.draw(st.lists(st.integers(0, len(items) - 1), max_size=40)) if items else []
    assert bytecolumn.values(bytecolumn.take(col, order)) == [items[i] for i in order]
    assert bytecolumn.values(bytecolumn.concat([col, col])) == items + items
    start = data.draw(st.integers(0, len(items)))
    stop = data.draw(st.integers(start, len(items)))
    present = [item for item in items[start:stop] if item is not None]
    if len(present) == stop - start:  # a batch: no missing values
        buffer, offsets = bytecolumn.ragged(col.slice(start, stop - start))
        assert int(offsets[0]) == 0 and len(offsets) == stop - start + 1
        assert [buffer[a:b] for a, b in itertools.pairwise(offsets.tolist())] == present
