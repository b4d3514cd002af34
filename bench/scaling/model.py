"""The measured workload: an MLP on fixed-size byte samples, its counted FLOPs, and a timed all-reduce.

The all-reduce is timed by wrapping DDP's default comm hook: each bucket records when autograd handed it
over (``ready``) and when its all-reduce finished. ``backward`` in the breakdown ends when the last bucket
was ready (gradient compute); the rest of ``loss.backward()``, waiting for the all-reduces and writing the
averaged gradients back, is the exposed ``allreduce``. The union of [ready, done] intervals is the time
communication was in flight, part of it hidden behind the remaining backward compute.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import nn
from torch._C._distributed_c10d import GradBucket  # dist.GradBucket, as mypy sees it
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.utils.flop_counter import FlopCounterMode

INPUT_BYTES = 768  # every 1 KiB (+-25%) sample has at least this many bytes: the MLP reads the first 768
NUM_CLASSES = 10


def build_mlp(hidden: int, layers: int) -> nn.Sequential:
    """``layers`` hidden Linear+ReLU of width ``hidden``, then a 10-way head: plain GEMMs, easy to count."""
    parts: list[nn.Module] = []
    width = INPUT_BYTES
    for _ in range(layers):
        parts += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    parts.append(nn.Linear(width, NUM_CLASSES))
    return nn.Sequential(*parts)


def analytic_flops_per_sample(model: nn.Module) -> int:
    """2 x in x out per Linear forward, x3 for forward + backward (the usual "model FLOPs")."""
    return 3 * sum(2 * m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))


def counted_flops_per_sample(model: nn.Module, batch_size: int) -> int:
    """FLOPs of one forward + backward as ``FlopCounterMode`` counts them, per sample.

    Slightly below the analytic count: no gradient is computed for the input of the first layer.
    """
    x = torch.randn(batch_size, INPUT_BYTES)
    y = torch.randint(0, NUM_CLASSES, (batch_size,))
    with FlopCounterMode(display=False) as counter:
        nn.functional.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops()) // batch_size


def to_inputs(batch: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A loader batch (RaggedBytes ``bin``, decoded ``cls``) -> (B, 768) floats in [0, 1] and labels."""
    ragged = batch["bin"]
    buffer = np.frombuffer(ragged.buffer, dtype=np.uint8)
    rows = buffer[ragged.offsets[:-1, None] + np.arange(INPUT_BYTES)]  # first 768 bytes of each sample
    x = torch.from_numpy(rows)
    labels = batch["cls"]
    if device.type == "cuda":
        x, labels = (
            x.pin_memory().to(device, non_blocking=True),
            labels.pin_memory().to(device, non_blocking=True),
        )
    return x.float().div_(255), labels.long()


def synthetic_batches(batch_size: int, seed: int, count: int = 8) -> list[dict[str, torch.Tensor]]:
    """A few in-memory batches to cycle through: the same step with no loader behind it."""
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "x": torch.randint(0, 256, (batch_size, INPUT_BYTES), dtype=torch.uint8, generator=g),
            "y": torch.randint(0, NUM_CLASSES, (batch_size,), generator=g),
        }
        for _ in range(count)
    ]


class CommTimer:
    """State of :func:`timed_allreduce_hook`: per bucket (ready, done) perf_counter times for one step."""

    def __init__(self) -> None:
        self.intervals: list[tuple[float, float]] = []
        self.ready: list[float] = []

    def reset(self) -> None:
        self.intervals.clear()
        self.ready.clear()

    def last_ready(self) -> float | None:
        return max(self.ready) if self.ready else None

    def in_flight(self) -> float:
        """Length of the union of the buckets' [ready, done] intervals."""
        total, end = 0.0, float("-inf")
        for start, stop in sorted(self.intervals):
            if stop > end:
                total += stop - max(start, end)
                end = stop
        return total


def timed_allreduce_hook(state: CommTimer, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default all-reduce (average over ranks), with its start and completion times recorded."""
    ready = time.perf_counter()
    state.ready.append(ready)

    def done(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        state.intervals.append((ready, time.perf_counter()))
        return fut.value()

    return allreduce_hook(None, bucket).then(done)  # type: ignore[arg-type]


# DDP compares the hook's annotations with the real types; ``from __future__ import annotations`` made them
# strings, so give it the objects.
timed_allreduce_hook.__annotations__.update(
    {"bucket": GradBucket, "return": torch.futures.Future[torch.Tensor]}
)
