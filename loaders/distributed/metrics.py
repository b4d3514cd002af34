"""Exact global classification metrics from local sums: one all-reduce, the division on every rank.

Averaging per-rank accuracies is wrong whenever ranks saw different numbers of real samples (uneven last
batches, padded duplicates). Instead every rank keeps sums and counts (int64 counts, float64 loss), the
sums travel in ONE float64 vector through one `all_reduce(SUM)`, and every rank divides the same totals,
so every rank reports the same numbers, equal to a single process computing over the union of samples
(float64 holds counts exactly up to 2**53).

Padded samples (the loader's `__pad__` flag, passed as `pad_mask`) are left out of everything. A mixture's
`__source__` column (passed as `source`) adds accuracy, loss and samples per source, in the same vector.

Macro F1 is the mean over classes of 2TP / (2TP + FP + FN), taken over the classes that occur in the
targets or the predictions; a class with neither has an undefined F1 and is left out rather than counted as
0 or 1. This equals sklearn's `f1_score(y, p, average="macro", labels=<classes present in y or p>)`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DistributedMetrics"]


class DistributedMetrics:
    """Accumulate accuracy, mean loss and macro F1 locally; `compute()` reduces once across ranks.

    `compute()` is a collective when a process group is initialized: call it on every rank of `group`.
    """

    def __init__(self, num_classes: int, group: Any = None, *, num_sources: int = 0):
        """``num_sources`` > 0 also keeps accuracy and loss per source of a mixture (``update(...,
        source=batch["__source__"])``), reduced in the same all-reduce."""
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
        if isinstance(num_sources, bool) or not isinstance(num_sources, int) or num_sources < 0:
            raise ValueError(f"num_sources must be an integer >= 0, got {num_sources!r}")
        self.num_classes = num_classes
        self.num_sources = num_sources
        self.group = group
        self.reset()

    def reset(self) -> None:
        """Forget everything seen so far (start of an epoch)."""
        c = self.num_classes
        self._true_positives = torch.zeros(c, dtype=torch.int64)
        self._predicted = torch.zeros(c, dtype=torch.int64)  # TP + FP per class
        self._support = torch.zeros(c, dtype=torch.int64)  # TP + FN per class
        self._num_samples = 0
        self._loss_sum = 0.0  # python float is float64
        self._num_loss_samples = 0
        # Per source: [correct, samples, loss_sum, loss_samples] as float64 rows (exact counts up to 2**53).
        self._per_source = torch.zeros((self.num_sources, 4), dtype=torch.float64)

    def update(
        self,
        logits_or_preds: torch.Tensor,
        targets: torch.Tensor,
        loss: torch.Tensor | float | None = None,
        pad_mask: torch.Tensor | None = None,
        source: torch.Tensor | None = None,
    ) -> None:
        """Add one batch.

        `logits_or_preds`: (B, C) scores (argmax taken) or (B,) class indices. `loss`: per-sample losses (B,)
        (`reduction="none"`), or the batch's mean loss, which is weighted by the number of samples and is
        refused when the batch has pads (a mean cannot leave them out). `pad_mask`: (B,) bool, True = pad.
        `source`: (B,) each sample's source index (a mixture's `__source__`), with `num_sources` > 0.
        """
        targets = targets.detach().reshape(-1).to("cpu", torch.int64)
        preds = self._to_preds(logits_or_preds, targets.numel())
        keep = self._keep_mask(pad_mask, targets.numel())
        if source is not None:
            self._add_sources(source, preds == targets, keep, loss)
        targets, preds = targets[keep], preds[keep]
        for name, values in (("targets", targets), ("predictions", preds)):
            if values.numel() and (int(values.min()) < 0 or int(values.max()) >= self.num_classes):
                raise ValueError(
                    f"{name} hold classes {int(values.min())}..{int(values.max())}; "
                    f"valid classes are 0..{self.num_classes - 1}"
                )
        c = self.num_classes
        self._true_positives += torch.bincount(targets[preds == targets], minlength=c)
        self._predicted += torch.bincount(preds, minlength=c)
        self._support += torch.bincount(targets, minlength=c)
        self._num_samples += int(targets.numel())
        if loss is not None:
            self._add_loss(loss, keep)

    def _to_preds(self, logits_or_preds: torch.Tensor, batch_size: int) -> torch.Tensor:
        out = logits_or_preds.detach()
        if out.dim() == 2 and out.shape[1] == self.num_classes and out.shape[0] == batch_size:
            out = out.argmax(dim=1)
        out = out.reshape(-1)
        if out.numel() != batch_size:
            raise ValueError(
                f"logits_or_preds has shape {tuple(logits_or_preds.shape)}; expected ({batch_size}, "
                f"{self.num_classes}) logits or ({batch_size},) class indices for {batch_size} targets"
            )
        if out.is_floating_point():
            raise ValueError("class indices must be integers; pass logits as (batch, num_classes)")
        return out.to("cpu", torch.int64)

    @staticmethod
    def _keep_mask(pad_mask: torch.Tensor | None, batch_size: int) -> torch.Tensor:
        if pad_mask is None:
            return torch.ones(batch_size, dtype=torch.bool)
        mask = pad_mask.detach().reshape(-1).to("cpu")
        if mask.numel() != batch_size:
            raise ValueError(f"pad_mask has {mask.numel()} entries for {batch_size} targets")
        return ~mask.to(torch.bool)

    def _add_loss(self, loss: torch.Tensor | float, keep: torch.Tensor) -> None:
        if isinstance(loss, torch.Tensor):
            values = loss.detach().to("cpu", torch.float64)
        else:
            values = torch.tensor(float(loss), dtype=torch.float64)  # as_tensor would round through float32
        if values.numel() == keep.numel() and values.dim() > 0:
            self._loss_sum += float(values.reshape(-1)[keep].sum())
            self._num_loss_samples += int(keep.sum())
        elif values.numel() == 1:
            if not bool(keep.all()):
                raise ValueError(
                    "a mean loss cannot leave padded samples out; pass per-sample losses "
                    "(e.g. cross_entropy(..., reduction='none')) when the batch has pads"
                )
            self._loss_sum += float(values.reshape(())) * keep.numel()
            self._num_loss_samples += keep.numel()
        else:
            raise ValueError(
                f"loss has {values.numel()} values for {keep.numel()} samples; "
                "pass one loss per sample, or the batch's mean"
            )

    def _add_sources(
        self,
        source: torch.Tensor,
        correct: torch.Tensor,
        keep: torch.Tensor,
        loss: torch.Tensor | float | None,
    ) -> None:
        n = self.num_sources
        index = source.detach().reshape(-1).to("cpu", torch.int64)
        if index.numel() != keep.numel():
            raise ValueError(f"source has {index.numel()} entries for {keep.numel()} targets")
        if n == 0 or (index.numel() and (int(index.min()) < 0 or int(index.max()) >= n)):
            raise ValueError(f"source indices must be in 0..{n - 1} (num_sources={n}); pass num_sources=")
        index = index[keep]
        rows = torch.zeros((n, 4), dtype=torch.float64)
        rows[:, 0] = torch.bincount(index[correct[keep]], minlength=n).to(torch.float64)
        rows[:, 1] = torch.bincount(index, minlength=n).to(torch.float64)
        if isinstance(loss, torch.Tensor) and loss.dim() > 0 and loss.numel() == keep.numel():
            values = loss.detach().to("cpu", torch.float64).reshape(-1)[keep]
            rows[:, 2] = torch.bincount(index, weights=values, minlength=n)
            rows[:, 3] = rows[:, 1]
        self._per_source += rows

    def compute(self) -> dict[str, Any]:
        """Global `accuracy`, mean `loss`, `macro_f1` and `samples`; None where nothing defines a value."""
        c = self.num_classes
        # One vector, one all-reduce: [TP(c), predicted(c), support(c), samples, loss_sum, loss_samples].
        totals = torch.cat(
            [
                self._true_positives.to(torch.float64),
                self._predicted.to(torch.float64),
                self._support.to(torch.float64),
                torch.tensor(
                    [self._num_samples, self._loss_sum, self._num_loss_samples], dtype=torch.float64
                ),
                self._per_source.reshape(-1),
            ]
        )
        if dist.is_available() and dist.is_initialized():
            device = _reduce_device(self.group)
            reduced = totals.to(device)
            dist.all_reduce(reduced, op=dist.ReduceOp.SUM, group=self.group)
            totals = reduced.cpu()
        tp, predicted, support = totals[:c], totals[c : 2 * c], totals[2 * c : 3 * c]
        num_samples, loss_sum, num_loss_samples = (float(v) for v in totals[3 * c : 3 * c + 3])
        per_source = totals[3 * c + 3 :].reshape(-1, 4).tolist()
        present = (predicted + support) > 0
        # 2TP / (2TP + FP + FN) and 2TP + FP + FN = predicted + support.
        f1 = 2 * tp[present] / (predicted[present] + support[present])
        return {
            "accuracy": float(tp.sum()) / num_samples if num_samples else None,
            "loss": loss_sum / num_loss_samples if num_loss_samples else None,
            "macro_f1": float(f1.mean()) if bool(present.any()) else None,
            "samples": int(num_samples),
            **({"per_source": [_source_numbers(row) for row in per_source]} if self.num_sources else {}),
        }


def _source_numbers(row: list[float]) -> dict[str, float | int | None]:
    correct, samples, loss_sum, loss_samples = row
    return {
        "accuracy": correct / samples if samples else None,
        "loss": loss_sum / loss_samples if loss_samples else None,
        "samples": int(samples),
    }


def _reduce_device(group: Any) -> torch.device:
    """NCCL reduces only CUDA tensors; every other backend takes the CPU vector as is."""
    if "nccl" in str(dist.get_backend(group)).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
