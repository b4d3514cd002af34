"""Byte columns, Arrow arrays and lists alike: gathered spans, permutations, concatenations and batches
equal what slicing one value at a time gives."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardpipe.formats import bytecolumn

Case = tuple[bytes, np.ndarray, np.ndarray, np.ndarray | None]


@pytest.fixture(params=["arrow", "list"])
def kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which column ``gather`` makes: the size rule forced either way."""
    monkeypatch.setattr(bytecolumn, "ARROW_MAX_MEAN_BYTES", 1 << 30 if request.param == "arrow" else -1)
    return str(request.param)


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


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=spans_in_a_buffer())
def test_gather_gives_each_span_or_none(kind: str, case: Case) -> None:
    buffer, starts, stops, present = case
    expected = [
        buffer[a:b] if present is None or present[i] else None
        for i, (a, b) in enumerate(zip(starts.tolist(), stops.tolist(), strict=True))
    ]
    for source in (buffer, memoryview(buffer)):
        column = bytecolumn.gather(source, starts, stops, present)
        assert bytecolumn.values(column) == expected
        if present is None:  # spans read in order become one Arrow array, unless forced to a list
            ascending = len(starts) > 0 and bool((starts[1:] >= stops[:-1]).all())
            assert isinstance(column, list) == (kind == "list" or not ascending)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=spans_in_a_buffer(), data=st.data())
def test_gather_in_an_order_picks_the_values_in_that_order(
    kind: str, case: Case, data: st.DataObject
) -> None:
    """A window is shuffled by the gather that cuts it: any order of any subset of its spans (a resumed
    window skips its first picks), keys and missing values included."""
    buffer, starts, stops, present = case
    picks = data.draw(st.permutations(range(len(starts))))
    order = np.array(picks[: data.draw(st.integers(0, len(picks)))], np.int64)
    every = bytecolumn.values(bytecolumn.gather(buffer, starts, stops, present))
    assert bytecolumn.values(bytecolumn.gather(buffer, starts, stops, present, order)) == [
        every[i] for i in order.tolist()
    ]
    texts = bytecolumn.texts(buffer, starts, stops)
    if texts is not None:
        assert bytecolumn.texts(buffer, starts, stops, order) == [texts[i] for i in order.tolist()]


def test_gather_keeps_large_values_as_bytes_and_small_ones_in_arrow() -> None:
    size = bytecolumn.ARROW_MAX_MEAN_BYTES
    buffer = bytes(range(256)) * (3 * size // 256)
    small = bytecolumn.gather(buffer, np.array([0, size]), np.array([size, 2 * size]))
    large = bytecolumn.gather(buffer, np.array([0, size + 1]), np.array([size + 1, 2 * size + 2]))
    assert not isinstance(small, list) and isinstance(large, list)
    assert bytecolumn.values(large) == [buffer[: size + 1], buffer[size + 1 : 2 * size + 2]]


def test_gather_refuses_spans_outside_the_buffer() -> None:
    buffer = b"0123456789"
    for starts, stops in (([0, 8], [4, 11]), ([-1], [2]), ([5], [4])):
        with pytest.raises(ValueError, match="outside a buffer of 10 bytes"):
            bytecolumn.gather(buffer, np.array(starts), np.array(stops))
    # a missing value's span is never read, whatever it says
    missing = bytecolumn.gather(buffer, np.array([0, -5]), np.array([2, 99]), np.array([True, False]))
    assert bytecolumn.values(missing) == [b"01", None]


def test_texts_decode_utf8_and_refuse_what_is_not(kind: str) -> None:
    keys = ["a/1", "é/2", "", "日本/3"]
    lengths = np.array([len(key.encode()) for key in keys])
    stops = np.cumsum(lengths) + 2
    assert bytecolumn.texts(b"xx" + "".join(keys).encode(), stops - lengths, stops) == keys
    assert bytecolumn.texts(b"ok\xff", np.array([0, 2]), np.array([2, 3])) is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(st.one_of(st.none(), st.binary(max_size=20)), max_size=30), data=st.data())
def test_take_concat_and_batches_agree_with_lists(
    kind: str, items: list[bytes | None], data: st.DataObject
) -> None:
    lengths = [len(item or b"") for item in items]
    stops = np.cumsum(lengths, dtype=np.int64)
    present = np.array([item is not None for item in items], bool)
    column = bytecolumn.gather(b"".join(item or b"" for item in items), stops - lengths, stops, present)
    order = data.draw(st.lists(st.integers(0, len(items) - 1), max_size=40)) if items else []
    assert bytecolumn.values(bytecolumn.take(column, order)) == [items[i] for i in order]
    assert bytecolumn.values(bytecolumn.concat([column, column])) == items + items
    assert bytecolumn.values(bytecolumn.concat([column, list(items)])) == items + items
    start = data.draw(st.integers(0, len(items)))
    stop = data.draw(st.integers(start, len(items)))
    missing = next((i for i in range(start, stop) if items[i] is None), None)
    assert bytecolumn.first_missing(column, start, stop) == missing
    if missing is None:
        buffer, offsets = bytecolumn.ragged(column, start, stop)
        assert int(offsets[0]) == 0 and len(offsets) == stop - start + 1
        assert [buffer[a:b] for a, b in itertools.pairwise(offsets.tolist())] == items[start:stop]
