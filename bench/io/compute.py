"""The training-like consumer of each batch: host-to-device copy, then a compute step.

On CUDA: pinned batches copied with ``non_blocking=True``, a small ResNet-style model trained in bf16 (on
the bytes as 1-channel images, or, for the image profiles, on the decoded crops), both
timed with CUDA events and synchronized at the end of the step (so the next ``next()`` wait is real, not
hidden behind queued kernels). On CPU: no copy, and a busy step of fixed work calibrated before the runs to
take ``compute_ms`` on an idle core (``0``: a pure read benchmark). Its measured time can exceed the
calibration when workers compete for the same cores; that contention is part of what is measured.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn

from loaders.monitor import InputMonitor

_MATRIX = 64  # side of the square matmul the CPU step repeats


class BusyStep:
    """``iterations`` float32 64x64 matmuls: a fixed amount of work, calibrated to ``compute_ms``."""

    def __init__(self, compute_ms: float) -> None:
        if compute_ms < 0:
            raise ValueError(f"--compute-ms must be >= 0, got {compute_ms}")
        self.compute_ms = compute_ms
        self.a = torch.randn(_MATRIX, _MATRIX)
        self.b = torch.randn(_MATRIX, _MATRIX)
        self.iterations = 0
        if compute_ms > 0:
            per_iteration = min(self._time(200) / 200 for _ in range(5))
            self.iterations = max(1, round(compute_ms / 1000 / per_iteration))

    def _time(self, iterations: int) -> float:
        start = time.perf_counter()
        self.run(iterations)
        return time.perf_counter() - start

    def run(self, iterations: int) -> None:
        out = self.a
        for _ in range(iterations):
            out = torch.mm(out, self.b)
            out = out.clamp_(-1.0, 1.0)

    @property
    def flops(self) -> int:
        return self.iterations * 2 * _MATRIX**3

    def __call__(self, batch: Any, monitor: InputMonitor[Any]) -> None:
        with monitor.phase("compute"):
            self.run(self.iterations)


class _Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1, self.bn2 = nn.BatchNorm2d(channels), nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


def small_resnet(num_classes: int = 10, width: int = 64, in_channels: int = 1, stride: int = 1) -> nn.Module:
    """Stem, two residual blocks, global pool, linear head: a real conv workload, a few GFLOPs per batch
    (``stride`` > 1: a patchifying stem, for full-size images)."""
    return nn.Sequential(
        nn.Conv2d(in_channels, width, max(3, stride), stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        _Block(width),
        _Block(width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, num_classes),
    )


class _Bottleneck(nn.Module):
    """1x1 down, 3x3, 1x1 up (x4), with a projected shortcut where the shape changes."""

    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        outputs = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(inputs, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, outputs, 1, bias=False),
            nn.BatchNorm2d(outputs),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def bottleneck_resnet(num_classes: int = 10, depths: tuple[int, ...] = (3, 4, 6, 3)) -> nn.Module:
    """ResNet-50's shape (a 7x7 stride-2 stem, max pool, four stages of bottleneck blocks, 64-512 wide,
    3-4-6-3 deep, global pool, linear head): the compute of the usual ImageNet model at 224 x 224."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1),
    ]
    inputs = 64
    for stage, depth in enumerate(depths):
        width = 64 << stage
        for block in range(depth):
            layers.append(_Bottleneck(inputs, width, 2 if block == 0 and stage > 0 else 1))
            inputs = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, num_classes)]
    return nn.Sequential(*layers)


class _GpuTraining:
    """One bf16 training step of a model on the GPU, timed by CUDA events: the copy from ``start`` to
    ``copied`` (a subclass copies), the step from ``copied`` to ``done`` (:meth:`train`), synchronized at
    the end."""

    def __init__(self, model: nn.Module) -> None:
        self.device = torch.device("cuda")
        self.model = model.to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]

    def train(self, images: torch.Tensor, target: torch.Tensor, monitor: InputMonitor[Any]) -> None:
        start, copied, done = self.events
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(self.model(images), target)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        done.record()
        done.synchronize()
        monitor.add("copy", start.elapsed_time(copied) / 1000)
        monitor.add("compute", copied.elapsed_time(done) / 1000)


class GpuStep(_GpuTraining):
    """Copy (pinned, non-blocking) and one bf16 training step of ``small_resnet``, timed by CUDA events."""

    def __init__(self, sample_bytes: int) -> None:
        super().__init__(small_resnet())
        self.side = max(8, min(64, math.isqrt(sample_bytes * 3 // 4)))  # every sample has >= side**2 bytes

    def __call__(self, batch: Any, monitor: InputMonitor[Any]) -> None:
        start, copied, _ = self.events
        start.record()
        payload = batch["bin"]  # a hand-written loop's list of bytes is joined here, as its user would
        host = (
            torch.frombuffer(bytearray(b"".join(payload)), dtype=torch.uint8)
            if isinstance(payload, list)
            else payload.to_tensors()[0]
        )
        data = host.pin_memory().to(self.device, non_blocking=True)
        cls = batch["cls"]
        decoded = isinstance(cls, torch.Tensor)  # the -cls rows decode it to class indices already
        labels = (cls if decoded else cls.to_tensors()[0]).pin_memory().to(self.device, non_blocking=True)
        copied.record()
        n = len(batch["bin"])
        pixels = self.side * self.side
        images = data[: n * pixels].view(n, 1, self.side, self.side).float().div_(255)  # bytes as images
        # Raw cls values are one ASCII digit each.
        target = (labels.long() if decoded else labels.long() - 48).clamp_(0, 9)[:n]
        self.train(images, target, monitor)


class ImageGpuStep(_GpuTraining):
    """The image profiles' step: the uint8 crops (B, 3, H, W) copied pinned and non-blocking, normalised
    on the GPU (where the float conversion belongs), one bf16 training step of ``small_resnet`` with a
    stride-4 stem; timed by CUDA events like :class:`GpuStep`."""

    MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, in [0, 1]

    def __init__(self, field: str = "jpg", label: str = "cls", model: nn.Module | None = None) -> None:
        super().__init__(model if model is not None else small_resnet(in_channels=3, stride=4))
        self.field, self.label = field, label
        self.mean = torch.tensor(self.MEAN, device=self.device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(self.STD, device=self.device).view(1, 3, 1, 1) * 255

    def __call__(self, batch: Any, monitor: InputMonitor[Any]) -> None:
        start, copied, _ = self.events
        start.record()
        pixels = batch[self.field]  # already on the GPU when the loader decoded there (--device cuda)
        pixels = pixels if pixels.is_cuda else pixels.pin_memory().to(self.device, non_blocking=True)
        labels = batch.get(self.label)
        if isinstance(labels, torch.Tensor):
            target = labels.pin_memory().to(self.device, non_blocking=True).long().clamp_(0, 9)
        else:  # a pack of the user's without decoded labels: any class will do for the timing
            target = torch.zeros(len(pixels), dtype=torch.long, device=self.device)
        copied.record()
        self.train(pixels.float().sub_(self.mean).div_(self.std), target, monitor)


Step = BusyStep | GpuStep | ImageGpuStep
"""What a run calls on each batch, with the monitor that times it."""


def make_step(compute_ms: float, sample_bytes: int) -> BusyStep | GpuStep:
    """The GPU model when CUDA is there, else the calibrated CPU step."""
    return GpuStep(sample_bytes) if torch.cuda.is_available() else BusyStep(compute_ms)


def make_image_step(
    compute_ms: float, field: str = "jpg", label: str = "cls", *, resnet50: bool = False
) -> BusyStep | ImageGpuStep:
    """The image model when CUDA is there (``resnet50``: a ResNet-50-sized one), else the calibrated CPU
    step."""
    if not torch.cuda.is_available():
        return BusyStep(compute_ms)
    return ImageGpuStep(field, label, bottleneck_resnet() if resnet50 else None)
