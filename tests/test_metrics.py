"""DistributedMetrics: exact global metrics from one all-reduce, pads excluded, checked against sklearn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, f1_score

from loaders.distributed.metrics import DistributedMetrics
from testkit.distributed import run_ranks

pytestmark = pytest.mark.dist

NUM_CLASSES = 5
# Deliberately uneven: rank 1 sees one batch, rank 2 four, batch sizes differ within and across ranks.
BATCH_SIZES = {0: [6, 3], 1: [7], 2: [2, 5, 4, 1]}


def _batches(rank: int) -> list[dict[str, np.ndarray]]:
    """The same data on the rank and in the oracle: seeded by rank, some samples flagged as pads."""
    rng = np.random.default_rng([17, rank])
    out = []
    for batch_index, size in enumerate(BATCH_SIZES[rank]):
        logits = rng.normal(size=(size, NUM_CLASSES))
        # Class 4 never appears as a target, so the F1 class rule (present in targets or predictions) matters.
        targets = rng.integers(0, NUM_CLASSES - 1, size=size)
        pad = rng.random(size) < 0.25
        # The first batch of each rank has no pads, to exercise the mean-loss path.
        if batch_index == 0:
            pad[:] = False
        losses = rng.exponential(size=size)
        out.append({"logits": logits, "targets": targets, "pad": pad, "losses": losses})
    return out


def _feed(metrics: DistributedMetrics, batches: list[dict[str, np.ndarray]]) -> None:
    for batch_index, b in enumerate(batches):
        logits = torch.from_numpy(b["logits"])
        targets = torch.from_numpy(b["targets"])
        pad = torch.from_numpy(b["pad"])
        if batch_index == 0:
            # Class indices and a mean loss (no pads in this batch).
            metrics.update(logits.argmax(1), targets, loss=float(b["losses"].mean()), pad_mask=pad)
        else:
            metrics.update(logits, targets, loss=torch.from_numpy(b["losses"]), pad_mask=pad)


def _oracle(batches: list[dict[str, np.ndarray]]) -> dict[str, float | int]:
    """Single-process metrics over the union of the unpadded samples."""
    keep = np.concatenate([~b["pad"] for b in batches])
    y = np.concatenate([b["targets"] for b in batches])[keep]
    p = np.concatenate([b["logits"].argmax(1) for b in batches])[keep]
    losses = np.concatenate([b["losses"] for b in batches])[keep]
    present = sorted(set(y.tolist()) | set(p.tolist()))
    return {
        "accuracy": accuracy_score(y, p),
        "loss": float(np.mean(losses)),
        "macro_f1": f1_score(y, p, average="macro", labels=present),
        "samples": int(keep.sum()),
    }


def _check(result: dict[str, float | int | None], expected: dict[str, float | int]) -> None:
    assert result["samples"] == expected["samples"]
    for key in ("accuracy", "loss", "macro_f1"):
        assert result[key] == pytest.approx(expected[key], abs=1e-12, rel=0), key


def _rank_metrics(rank: int, world_size: int) -> dict[str, float | int | None]:
    metrics = DistributedMetrics(NUM_CLASSES)
    _feed(metrics, _batches(rank))
    return metrics.compute()


@pytest.mark.timeout(60)
def test_three_uneven_ranks_equal_single_process_over_union() -> None:
    results = run_ranks(_rank_metrics, 3, timeout=45)
    union = [b for rank in range(3) for b in _batches(rank)]
    expected = _oracle(union)
    assert expected["samples"] < sum(sum(s) for s in BATCH_SIZES.values())  # some pads were excluded
    for result in results:
        _check(result, expected)
    assert results[0] == results[1] == results[2]  # the same totals, divided the same way, on every rank


def test_single_process_matches_sklearn_and_reset() -> None:
    batches = _batches(2)
    metrics = DistributedMetrics(NUM_CLASSES)
    _feed(metrics, batches)
    _check(metrics.compute(), _oracle(batches))
    metrics.reset()
    assert metrics.compute() == {"accuracy": None, "loss": None, "macro_f1": None, "samples": 0}


def test_all_padded_batch_counts_nothing() -> None:
    metrics = DistributedMetrics(3)
    metrics.update(torch.tensor([0, 1]), torch.tensor([0, 2]), pad_mask=torch.tensor([True, True]))
    assert metrics.compute()["samples"] == 0


def test_mean_loss_with_pads_is_refused() -> None:
    metrics = DistributedMetrics(3)
    with pytest.raises(ValueError, match="per-sample losses"):
        pad = torch.tensor([False, True])
        metrics.update(torch.tensor([0, 1]), torch.tensor([0, 1]), loss=0.5, pad_mask=pad)


@pytest.mark.parametrize(
    ("preds", "targets", "match"),
    [
        (torch.tensor([0, 3]), torch.tensor([0, 1]), "valid classes"),
        (torch.tensor([0, 1]), torch.tensor([0, -1]), "valid classes"),
        (torch.zeros(2, 4), torch.tensor([0, 1]), "expected"),
    ],
)
def test_bad_inputs_raise(preds: torch.Tensor, targets: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DistributedMetrics(3).update(preds, targets)


def test_num_classes_validated() -> None:
    with pytest.raises(ValueError, match="num_classes"):
        DistributedMetrics(0)
