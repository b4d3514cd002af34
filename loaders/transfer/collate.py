"""Batch collation that moves bytes between processes cheaply.

Every tensor that crosses from a DataLoader worker in shared memory costs a file-descriptor round trip,
which dominates small batches; pickled inline through the worker's pipe, small ones cost a copy. So a
batch of raw byte fields becomes one :class:`RaggedBytes` per field (one buffer plus offsets, no
per-sample objects), and a :class:`Batch` sends its small tensors inline, rebuilding them as tensors on
arrival; large tensors still use shared memory. Why: docs/design.md, "Transfer".
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import register_pytree_node
from torch.utils.data import default_collate

from shardpipe.formats import bytecolumn

INLINE_TENSOR_BYTES = 1 << 20  # below this a tensor crosses processes inline, above it in shared memory


class RaggedBytes:
    """A batch of variable-length byte strings: ``buffer[offsets[i]:offsets[i + 1]]`` is item i.

    ``buffer`` is ``bytes`` or a read-only ``memoryview`` of the column the batch was cut from (no copy);
    items come out as ``bytes`` either way, and a pickled batch carries ``bytes``. It is deliberately
    neither a dataclass nor a ``Sequence``: the collection utilities trainers apply to a batch (Lightning's
    ``apply_to_collection``, Accelerate's ``send_to_device``, ``torch.utils._pytree``) then pass it through
    whole instead of rebuilding it (a ``memoryview`` cannot be rebuilt from a list)."""

    __slots__ = ("buffer", "offsets")
    buffer: bytes | memoryview
    offsets: np.ndarray  # (n + 1,) int64

    def __init__(self, buffer: bytes | memoryview, offsets: np.ndarray) -> None:
        object.__setattr__(self, "buffer", buffer)
        object.__setattr__(self, "offsets", offsets)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"RaggedBytes is immutable: cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RaggedBytes):
            return NotImplemented
        return self.tolist() == other.tolist()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RaggedBytes({len(self)} items, {self.nbytes} bytes)"

    @classmethod
    def from_list(cls, items: Sequence[bytes]) -> RaggedBytes:
        return cls(*bytecolumn.ragged(list(items), 0, len(items)))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> bytes:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} items")
        index %= len(self)
        return bytes(self.buffer[self.offsets[index] : self.offsets[index + 1]])

    def __iter__(self) -> Iterator[bytes]:
        bounds = self.offsets.tolist()
        buffer = self.buffer
        for i in range(len(bounds) - 1):
            yield bytes(buffer[bounds[i] : bounds[i + 1]])

    def __reduce__(self) -> tuple[Any, tuple[bytes, np.ndarray]]:
        buffer = self.buffer if isinstance(self.buffer, bytes) else self.buffer.tobytes()
        return RaggedBytes, (buffer, self.offsets)

    def tolist(self) -> list[bytes]:
        return list(self)

    @property
    def nbytes(self) -> int:
        return len(self.buffer)

    def to_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(data uint8 (total_bytes,), offsets int64 (n + 1,)): e.g. for decoding on the GPU."""
        data = torch.frombuffer(bytearray(self.buffer), dtype=torch.uint8) if self.buffer else torch.empty(0)
        return data.to(torch.uint8), torch.from_numpy(self.offsets.copy())


class Batch(dict[str, Any]):
    """A collated batch (a plain dict to its user) that crosses from a worker without shared-memory fds."""

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return _from_wire, ({name: _to_wire(value) for name, value in self.items()},)


def _flatten_batch(batch: Batch) -> tuple[list[Any], list[str]]:
    return list(batch.values()), list(batch.keys())


def _unflatten_batch(values: Iterable[Any], names: Any) -> Batch:
    return Batch(zip(names, values, strict=True))


# A dict subclass is a leaf to torch's pytree unless registered: registered, ``tree_map`` reaches the
# tensors of a batch (what ``torch.compile`` and device-transfer helpers built on pytree do).
register_pytree_node(Batch, _flatten_batch, _unflatten_batch, serialized_type_name="loaders.batches.Batch")


@dataclass(frozen=True, slots=True)
class _InlineTensor:
    array: np.ndarray


def _to_wire(value: Any) -> Any:
    if (
        isinstance(value, torch.Tensor)
        and value.device.type == "cpu"
        and value.nbytes < INLINE_TENSOR_BYTES
        and not value.requires_grad
        and value.dtype != torch.bfloat16  # numpy has no bfloat16
    ):
        return _InlineTensor(value.numpy())
    return value


def _from_wire(wire: dict[str, Any]) -> Batch:
    return Batch(
        {k: torch.from_numpy(v.array) if isinstance(v, _InlineTensor) else v for k, v in wire.items()}
    )


def collate_samples(samples: Sequence[dict[str, Any]]) -> Batch:
    """Collate sample dicts: keys stay a list, bytes become RaggedBytes, the rest default-collate."""
    batch = Batch()
    for name in samples[0]:
        values = [s[name] for s in samples]
        if name == "__key__":
            batch[name] = values
        elif isinstance(values[0], bytes):
            batch[name] = RaggedBytes.from_list(values)
        else:
            batch[name] = default_collate(values)
    return batch
