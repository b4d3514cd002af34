"""The mixture's window reading order (``loaders.reading.mixed``): grouping by source and back."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.reading.mixed import by_source, read_order


@st.composite
def window_rows(draw: st.DrawFn) -> np.ndarray:
    """Rows ``(source, j0, j1, is_pad)`` as a window holds them: each source's rows walk its j upwards."""
    sources = draw(st.lists(st.integers(0, 3), min_size=0, max_size=30))
    next_j = [draw(st.integers(0, 5)) for _ in range(4)]
    rows = []
    for source in sources:
        start = next_j[source] + draw(st.sampled_from([0, 0, 1]))  # mostly contiguous, sometimes a gap
        stop = start + draw(st.integers(1, 4))
        rows.append((source, start, stop, draw(st.sampled_from([0, 0, 1]))))
        next_j[source] = stop
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


@settings(max_examples=200, deadline=None)
@given(window_rows())
def test_grouping_by_source_then_read_order_gives_back_the_window(rows: np.ndarray) -> None:
    samples = [(s, j, p) for s, a, b, p in rows.tolist() for j in range(a, b)]  # the window in read order
    groups = by_source(rows)
    firsts = list(dict.fromkeys(rows[:, 0].tolist()))
    assert list(groups) == firsts  # sources in order of first appearance
    grouped = [(s, j, p) for s, part in groups.items() for _, a, b, p in part.tolist() for j in range(a, b)]
    assert sorted(grouped) == sorted(samples) and len(grouped) == len(samples)
    for part in groups.values():  # joined: no two rows left that continue each other
        assert not np.any((part[1:, 1] == part[:-1, 2]) & (part[1:, 3] == part[:-1, 3]))
    assert [grouped[i] for i in read_order(rows).tolist()] == samples
