"""Collation: raw bytes become one buffer plus offsets per field; batches cross processes inline."""

from __future__ import annotations

import pickle

import pytest
import torch

from loaders.transfer.collate import INLINE_TENSOR_BYTES, Batch, RaggedBytes, collate_samples


def test_ragged_bytes_round_trip_and_indexing() -> None:
    items = [b"a", b"", b"xyz", b"\x00\x01"]
    ragged = RaggedBytes.from_list(items)
    assert ragged.tolist() == items and len(ragged) == 4 and ragged.nbytes == 6
    assert ragged[2] == b"xyz" and ragged[-1] == b"\x00\x01"
    with pytest.raises(IndexError, match="index 4 out of range for 4 items"):
        ragged[4]
    data, offsets = ragged.to_tensors()
    assert data.dtype == torch.uint8 and bytes(data.tolist()) == b"axyz\x00\x01"
    assert offsets.tolist() == [0, 1, 1, 4, 6]


def test_collate_keeps_keys_ragged_bytes_and_default_collates_the_rest() -> None:
    samples = [{"__key__": f"k{i}", "bin": bytes([i]) * i, "cls": i, "__pad__": i == 2} for i in range(3)]
    batch = collate_samples(samples)
    assert batch["__key__"] == ["k0", "k1", "k2"]
    assert isinstance(batch["bin"], RaggedBytes) and batch["bin"].tolist() == [b"", b"\x01", b"\x02\x02"]
    assert batch["cls"].tolist() == [0, 1, 2] and batch["__pad__"].tolist() == [False, False, True]


def test_small_tensors_travel_inline_large_ones_stay_tensors() -> None:
    small = torch.arange(4)
    large = torch.zeros(INLINE_TENSOR_BYTES // 4 + 1, dtype=torch.float32)
    wire = pickle.loads(pickle.dumps(Batch({"small": small, "large": large, "keys": ["a"]})))
    assert isinstance(wire, Batch)
    assert torch.equal(wire["small"], small) and torch.equal(wire["large"], large)
    assert wire["keys"] == ["a"]
    assert type(wire["small"]) is torch.Tensor  # rebuilt as a tensor on arrival


def test_a_batch_survives_the_collection_utilities_trainers_apply() -> None:
    """Lightning moves a batch with ``apply_to_collection``, Accelerate with ``send_to_device``, and both
    build on pytree in places: each must rebuild the batch with its raw columns intact."""
    from accelerate.utils import send_to_device
    from lightning.pytorch.utilities import move_data_to_device
    from torch.utils._pytree import tree_map

    column = RaggedBytes.from_list([b"ab", b"", b"cde"])
    view = RaggedBytes(memoryview(bytes(column.buffer)).toreadonly(), column.offsets)
    batch = Batch({"__key__": ["k0", "k1", "k2"], "jpg": view, "__pad__": torch.tensor([False, True, False])})
    for move in (
        lambda b: move_data_to_device(b, "cpu"),
        lambda b: send_to_device(b, "cpu"),
        lambda b: tree_map(lambda x: x, b),
    ):
        moved = move(batch)
        assert isinstance(moved, Batch) and moved["jpg"] == column and moved["__key__"] == batch["__key__"]
        assert moved["__pad__"].tolist() == [False, True, False]
    with pytest.raises(AttributeError, match="immutable"):
        view.buffer = b""  # type: ignore[misc]
