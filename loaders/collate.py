"""Batch collation that moves bytes between processes cheaply.

A batch of raw byte fields becomes one :class:`RaggedBytes` per field: a single uint8 tensor plus an
offsets tensor. DataLoader workers hand tensors over in shared memory, so a batch costs two tensor
transfers instead of pickling one bytes object per sample. Other values use torch's default collation.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate


@dataclass(frozen=True, slots=True)
class RaggedBytes:
    """A batch of variable-length byte strings: ``data[offsets[i]:offsets[i + 1]]`` is item i."""

    data: torch.Tensor  # (total_bytes,) uint8
    offsets: torch.Tensor  # (n + 1,) int64

    @classmethod
    def from_list(cls, items: Sequence[bytes]) -> RaggedBytes:
        lengths = np.fromiter((len(b) for b in items), dtype=np.int64, count=len(items))
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        joined = bytearray(b"".join(items))  # writable, so torch.frombuffer needs no copy warning
        data = torch.frombuffer(joined, dtype=torch.uint8) if joined else torch.empty(0, dtype=torch.uint8)
        return cls(data, torch.from_numpy(offsets))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> bytes:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} items")
        index %= len(self)
        start, stop = int(self.offsets[index]), int(self.offsets[index + 1])
        return self.data[start:stop].numpy().tobytes()

    def __iter__(self) -> Iterator[bytes]:
        buffer = self.data.numpy()
        bounds = self.offsets.tolist()
        for i in range(len(self)):
            yield buffer[bounds[i] : bounds[i + 1]].tobytes()

    def tolist(self) -> list[bytes]:
        return list(self)

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())

    def pin_memory(self) -> RaggedBytes:
        return RaggedBytes(self.data.pin_memory(), self.offsets.pin_memory())


def collate_samples(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Collate sample dicts: keys stay a list, bytes become RaggedBytes, the rest default-collate."""
    batch: dict[str, Any] = {}
    for name in samples[0]:
        values = [s[name] for s in samples]
        if name == "__key__":
            batch[name] = values
        elif isinstance(values[0], bytes):
            batch[name] = RaggedBytes.from_list(values)
        else:
            batch[name] = default_collate(values)
    return batch
