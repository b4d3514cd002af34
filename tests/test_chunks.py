"""Chunks of batches: cut apart they are the worker's batches, interleaved in the DataLoader's order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.reading.columns import Columns, batches
from loaders.transfer.chunks import Chunk, chunks, interleave
from loaders.transfer.collate import Batch, RaggedBytes


def worker_columns(worker: int, count: int) -> Columns:
    keys = [f"w{worker}-{i}" for i in range(count)]
    blobs: list[bytes | None] = [bytes([worker]) * ((i * 7 + worker) % 5) for i in range(count)]
    return Columns(("bin",), keys, {"bin": blobs}, [i % 3 == 0 for i in range(count)])


def as_lists(batch: Batch) -> tuple[list[str], list[bytes], list[bool]]:
    ragged = batch["bin"]
    assert isinstance(ragged, RaggedBytes) and int(ragged.offsets[0]) == 0
    assert int(ragged.offsets[-1]) == len(ragged.buffer)
    return batch["__key__"], ragged.tolist(), batch["__pad__"].tolist()


def round_robin(streams: list[list[object]]) -> list[object]:
    """What a DataLoader delivers from per-worker streams: workers in turn from 0, finished ones left out."""
    out, position = [], [0] * len(streams)
    while any(position[w] < len(s) for w, s in enumerate(streams)):
        for w, stream in enumerate(streams):
            if position[w] < len(stream):
                out.append(stream[position[w]])
                position[w] += 1
    return out


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    batch_size=st.integers(1, 6),
    per_chunk=st.integers(1, 5),
)
def test_interleaved_chunks_are_the_single_batches_in_dataloader_order(
    counts: list[int], batch_size: int, per_chunk: int
) -> None:
    columns = [worker_columns(w, n) for w, n in enumerate(counts)]
    singles = [list(batches([c], batch_size)) for c in columns]
    chunked = [list(chunks(batches([c], batch_size * per_chunk), w)) for w, c in enumerate(columns)]
    for w, stream in enumerate(chunked):  # exactly one last chunk per worker, at the end
        assert [c.last for c in stream] == [False] * (len(stream) - 1) + [True]
        assert all(c.worker == w for c in stream)
    got = interleave(iter(round_robin(chunked)), len(counts), batch_size)  # type: ignore[arg-type]
    expected = round_robin(singles)  # type: ignore[arg-type]
    assert [as_lists(b) for b in got] == [as_lists(b) for b in expected]  # type: ignore[arg-type]


def test_a_worker_with_no_batches_still_says_it_is_done() -> None:
    assert list(chunks([], 3)) == [Chunk(3, None, True)]
    both = [Chunk(0, None, True), *chunks(batches([worker_columns(1, 4)], 2), 1)]
    assert [b["__key__"] for b in interleave(iter(both), 2, 2)] == [["w1-0", "w1-1"], ["w1-2", "w1-3"]]


def test_a_stream_that_ends_without_its_last_chunk_is_an_error() -> None:
    cut_short = [Chunk(0, next(batches([worker_columns(0, 2)], 2)), False)]
    with pytest.raises(RuntimeError, match="loader worker 0 stopped without its last chunk"):
        list(interleave(iter(cut_short), 1, 2))


def test_cut_batches_view_their_chunk_without_copying() -> None:
    chunk = next(batches([worker_columns(1, 12)], 12))
    chunk["bin"] = RaggedBytes(bytes(chunk["bin"].buffer), chunk["bin"].offsets)  # as a pipe delivers it
    cut_apart = list(interleave(iter([Chunk(0, chunk, True)]), 1, 5))
    assert [len(b["__key__"]) for b in cut_apart] == [5, 5, 2]
    assert all(b["bin"].buffer.obj is chunk["bin"].buffer for b in cut_apart)
    assert [v for b in cut_apart for v in b["bin"]] == list(chunk["bin"])
