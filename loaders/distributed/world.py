"""The one place that reads where this process sits: (rank, world_size) and (worker_index, num_workers).

Precedence for the world: explicit arguments, then an initialized torch.distributed process group, then
the ``RANK`` / ``WORLD_SIZE`` environment variables that torchrun sets, then a single process (0, 1).
A world larger than one with no known rank is an error: defaulting to rank 0 would make every process read
the same share.
"""

from __future__ import annotations

import os

import torch.distributed as dist
import torch.utils.data


def get_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world_size); each explicit argument overrides what the process group or environment says."""
    found_rank, found_size = _detect_world()
    rank = found_rank if rank is None else rank
    world_size = found_size if world_size is None else world_size
    if world_size is None:
        world_size = 1
    if rank is None:
        if world_size != 1:
            raise ValueError(
                f"world_size is {world_size} but the rank is unknown: build the dataset after the process "
                "group starts (in Lightning, in LightningDataModule.setup() or train_dataloader(), not "
                "__init__; with Accelerate or Fabric, after Accelerator() or fabric.launch()), or pass rank= "
                f"or set RANK to a value in [0, {world_size})"
            )
        rank = 0
    for name, value in (("rank", rank), ("world_size", world_size)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}) for world_size {world_size}, got {rank}")
    return rank, world_size


def _detect_world() -> tuple[int | None, int | None]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return _env_int("RANK"), _env_int("WORLD_SIZE")


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from exc


def get_worker() -> tuple[int, int]:
    """(worker_index, num_workers) inside a DataLoader worker; (0, 1) in the main process."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return 0, 1
    return int(info.id), int(info.num_workers)


def planned_workers() -> int:
    """The ``num_workers`` a plan made here counts: the DataLoader's inside a worker, 0 in the main process
    (which reads as one worker), as the loader that saves the run's state counts them."""
    info = torch.utils.data.get_worker_info()
    return 0 if info is None else int(info.num_workers)


def check_whole_batches(num_workers: int, batch_size: int | None, dataset: str) -> None:
    """Refuse two or more workers that cannot cut a rank's share into whole batches (``batch_size`` unknown):
    ``len`` would be off and ranks could run different step counts."""
    if num_workers > 1 and batch_size is None:
        raise ValueError(
            f"{num_workers} DataLoader workers share this rank's samples of {dataset}, but the dataset "
            "does not know the DataLoader's batch size, so their shares are not whole batches: len() "
            "would be off and ranks could run different step counts. Pass ShardedDataset(..., "
            "batch_size=B) with the DataLoader's batch size (1 without batching), or read it through "
            "make_loader(dataset, batch_size=B, num_workers=...), which sets it"
        )
