"""How a split is read: the options of a ``ShardedDataset`` (checked when it is made, not in a worker) and
the fields it reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loaders.planning.planner import DEFAULT_BLOCK_SIZE, DEFAULT_SHUFFLE_BUFFER, PlanConfig, Remainder
from loaders.reading.windows import OnError
from shardpipe.manifest import Manifest


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """How a split is read; everything here but ``on_error``, ``batched``, ``chunk_batches``, ``check`` and
    ``managed`` shapes the order."""

    split: str = "train"
    shuffle: bool = True
    seed: int = 0
    remainder: Remainder = "pad"
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    block_size: int = DEFAULT_BLOCK_SIZE
    batch_size: int | None = None  # the DataLoader's: each worker's share is whole batches (None: unknown)
    on_error: OnError = "raise"
    batched: bool = False
    check: bool = True
    chunk_batches: int = 1  # batches per worker message on the batch path (``loaders.transfer.chunks``)
    managed: bool = False  # a ShardedLoader hands the batches out, and so keeps the epochs

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.chunk_batches < 1:
            raise ValueError(f"chunk_batches must be >= 1, got {self.chunk_batches}")
        # Validates every planning field now, not in a worker.
        PlanConfig(
            world_size=1,
            num_workers=0,
            seed=self.seed,
            shuffle=self.shuffle,
            remainder=self.remainder,
            batch_size=self.batch_size or 1,
            block_size=self.block_size,
            shuffle_buffer=self.shuffle_buffer,
        )


def selected_fields(manifest: Manifest, fields: Sequence[str] | None, where: str) -> tuple[str, ...]:
    """The fields to read, in manifest order: all of them, or those named (each one the manifest has)."""
    if fields is None:
        return manifest.fields
    if isinstance(fields, str):
        raise TypeError(f"fields must be a sequence of field names, got the string {fields!r}")
    if unknown := sorted(set(fields) - set(manifest.fields)):
        raise ValueError(
            f"fields names {unknown} that {where} does not have; its fields are {', '.join(manifest.fields)}"
        )
    return tuple(name for name in manifest.fields if name in set(fields))
