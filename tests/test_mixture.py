"""``Mixture`` over real packs (tar and LMDB) through ``make_loader``: exact per-source counts per epoch,
the ``__source__`` column on both paths, per-source passes across epochs, worker-count independence, equal
steps, resume onto another world and worker count, and the errors for sources and states that do not fit."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import loaders.mixture as mixture_module
from loaders import Mixture, ShardedDataset, make_loader
from loaders.transfer.collate import collate_samples
from shardpipe.errors import DataError
from tests.datagen import pack_dataset
from tests.test_dataset import damage

BATCH = 4
SIZES = {"a": 23, "b": 11}


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        "a": pack_dataset(tmp_path_factory.mktemp("mix-a"), "tar", SIZES["a"], max_samples=5),
        "b": pack_dataset(tmp_path_factory.mktemp("mix-b"), "lmdb", SIZES["b"], max_samples=4),
    }


def mixture(paths: dict[str, Path], rank: int = 0, world: int = 1, **options: Any) -> Mixture:
    sources = {name: ShardedDataset(path, rank=rank, world_size=world) for name, path in paths.items()}
    options.setdefault("weights", {"a": 0.7, "b": 0.3})
    options.setdefault("samples_per_epoch", 40)
    return Mixture(sources, seed=4, **options)


def samples(loader: Any) -> list[tuple[int, str, bool]]:
    """(source, key, pad) of everything one pass yields."""
    out: list[tuple[int, str, bool]] = []
    for batch in loader:
        out += zip(batch["__source__"].tolist(), batch["__key__"], batch["__pad__"].tolist(), strict=True)
    return out


def test_exact_counts_equal_steps_and_the_source_column(paths: dict[str, Path]) -> None:
    mix = mixture(paths)
    assert mix.names == ("a", "b")
    loader = make_loader(mix, batch_size=BATCH, num_workers=0)
    for epoch in range(2):
        loader.set_epoch(epoch)
        got = samples(loader)
        assert len(got) == 40 and len(loader) == -(-40 // BATCH)
        assert Counter(s for s, _, pad in got if not pad) == {0: 28, 1: 12}


def test_per_source_passes_continue_across_epochs(paths: dict[str, Path]) -> None:
    """b draws 12 a epoch from 11 samples: over 3 epochs 36 draws, three whole passes plus 3 of the next."""
    loader = make_loader(mixture(paths), batch_size=BATCH, num_workers=0)
    keys: Counter[str] = Counter()
    for epoch in range(3):
        loader.set_epoch(epoch)
        keys.update(key for s, key, _ in samples(loader) if s == 1)
    assert len(keys) == SIZES["b"] and sorted(Counter(keys.values()).items()) == [(3, 8), (4, 3)]


def test_the_same_multiset_for_any_worker_count_and_path(paths: dict[str, Path]) -> None:
    seen = []
    for workers in (0, 2):
        loader = make_loader(mixture(paths), batch_size=BATCH, num_workers=workers, persistent_workers=False)
        loader.set_epoch(1)
        seen.append(sorted(samples(loader)))
    per_sample = make_loader(mixture(paths), batch_size=BATCH, num_workers=0, collate_fn=collate_samples)
    per_sample.set_epoch(1)
    seen.append(sorted(samples(per_sample)))
    assert seen[0] == seen[1] == seen[2]


def test_per_batch_gives_every_batch_its_share(paths: dict[str, Path]) -> None:
    loader = make_loader(
        mixture(paths, per_batch=True), batch_size=10, num_workers=2, persistent_workers=False
    )
    for batch in loader:
        counts = Counter(batch["__source__"].tolist())
        if len(batch["__key__"]) == 10:
            assert counts == {0: 7, 1: 3}


def test_a_resume_lands_the_rest_of_a_window_that_holds_none_of_a_source(paths: dict[str, Path]) -> None:
    """Resumed after every batch, with windows of 8 samples: where the rest of a window holds nothing of
    the LMDB source, that source has nothing to land (it once failed to locate zero records), and every
    resumed pass yields exactly what the uninterrupted one yields after that point."""

    def small_windows() -> Mixture:
        sources = {name: ShardedDataset(path, shuffle_buffer=8, block_size=1) for name, path in paths.items()}
        return Mixture(sources, weights={"a": 0.7, "b": 0.3}, samples_per_epoch=40, seed=4)

    whole = samples(make_loader(small_windows(), batch_size=2, num_workers=0))
    for consumed in range(1, len(whole) // 2):
        loader = make_loader(small_windows(), batch_size=2, num_workers=0)
        batches = iter(loader)
        for _ in range(consumed):
            next(batches)
        resumed = make_loader(small_windows(), batch_size=2, num_workers=0)
        resumed.load_state_dict(loader.state_dict())
        assert samples(resumed) == whole[2 * consumed :]


def test_resume_on_another_world_and_worker_count(paths: dict[str, Path]) -> None:
    loader = make_loader(mixture(paths), batch_size=BATCH, num_workers=2, persistent_workers=False)
    loader.set_epoch(3)
    batches = iter(loader)
    consumed = [x for _ in range(3) for x in samples([next(batches)])]
    state = json.loads(json.dumps(loader.state_dict()))
    del batches
    assert state["sources"]["b"] == {"pass": 3, "position": 3}  # 36 draws of 11 samples before epoch 3
    rest, steps = [], set()
    for rank in range(2):
        resumed = make_loader(
            mixture(paths, rank, 2), batch_size=BATCH, num_workers=1, persistent_workers=False
        )
        resumed.load_state_dict(state)
        resumed.set_epoch(3)
        mine = samples(resumed)
        steps.add((len(resumed), -(-len(mine) // BATCH)))
        rest += mine
    fresh = make_loader(mixture(paths), batch_size=BATCH, num_workers=0)
    fresh.set_epoch(3)
    whole = Counter((s, k) for s, k, pad in samples(fresh) if not pad)
    after = Counter((s, k) for s, k, pad in consumed + rest if not pad)
    assert after == whole and len(steps) == 1  # every remaining sample once, equal steps on both ranks


def test_a_state_with_other_weights_or_sources_is_refused(paths: dict[str, Path]) -> None:
    loader = make_loader(mixture(paths), batch_size=BATCH, num_workers=0)
    state = loader.state_dict()
    other = make_loader(mixture(paths, weights={"a": 0.5, "b": 0.5}), batch_size=BATCH, num_workers=0)
    with pytest.raises(ValueError, match=r"found mix=.*expected"):
        other.load_state_dict(state)
    swapped = Mixture({"b": ShardedDataset(paths["b"]), "a": ShardedDataset(paths["a"])}, {"a": 1, "b": 1})
    with pytest.raises(ValueError, match=r"found names=.*expected"):
        make_loader(swapped, batch_size=BATCH, num_workers=0).load_state_dict(state)


def test_sources_that_cannot_mix_are_refused(paths: dict[str, Path], tmp_path: Path) -> None:
    other = pack_dataset(tmp_path, "tar", 5, fields=("bin",))
    with pytest.raises(ValueError, match=r"fields only in 'a': \['txt'\]"):
        Mixture({"a": ShardedDataset(paths["a"]), "c": ShardedDataset(other)}, {"a": 1.0, "c": 1.0})
    drop = ShardedDataset(paths["b"], remainder="drop")
    with pytest.raises(ValueError, match="source 'b' has remainder='drop'"):
        Mixture({"a": ShardedDataset(paths["a"]), "b": drop}, {"a": 1.0, "b": 1.0})
    decoded = ShardedDataset(paths["b"], decode={"txt": "txt"})
    with pytest.raises(ValueError, match=r"decode fields \['txt'\] differently"):
        Mixture({"a": ShardedDataset(paths["a"]), "b": decoded}, {"a": 1.0, "b": 1.0})
    with pytest.raises(ValueError, match="unknown source"):
        mixture(paths, weights={"a": 1.0, "b": 1.0, "z": 1.0})
    with pytest.raises(ValueError, match="samples_per_epoch"):
        mixture(paths, samples_per_epoch=0)


def test_changing_the_mix_continues_each_sources_pass(paths: dict[str, Path]) -> None:
    loader = make_loader(mixture(paths), batch_size=BATCH, num_workers=0)
    loader.set_epoch(1)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()  # epoch 1 began with a at 28, b at 12 (one pass and 1)
    del batches
    changed = mixture(paths, weights={"a": 0.25, "b": 0.75})
    assert changed.continue_passes(state) == 2
    assert changed.state_extras(2)["sources"] == {  # epoch 1 counted whole: a 56 = 2 x 23 + 10, b 24
        "a": {"pass": 2, "position": 10},
        "b": {"pass": 2, "position": 2},
    }
    resumed = make_loader(changed, batch_size=BATCH, num_workers=0)
    resumed.set_epoch(2)
    assert Counter(s for s, _, pad in samples(resumed) if not pad) == {0: 10, 1: 30}
    saved = resumed.state_dict()
    again = make_loader(mixture(paths, weights={"a": 0.25, "b": 0.75}), batch_size=BATCH, num_workers=0)
    again.load_state_dict(saved)  # the changed run's own state carries where its passes continue from
    assert again.sharded.state_extras(2) == changed.state_extras(2)


def test_a_remote_source_mixes_with_a_local_one(
    paths: dict[str, Path], http_dir: tuple[Path, str], tmp_path: Path
) -> None:
    import shutil

    from loaders import RemoteOptions

    folder, url = http_dir
    shutil.copytree(paths["b"], folder, dirs_exist_ok=True)
    remote = ShardedDataset(url, remote=RemoteOptions(cache_dir=tmp_path / "cache"))
    mixed = Mixture(
        {"a": ShardedDataset(paths["a"]), "b": remote}, {"a": 0.7, "b": 0.3}, samples_per_epoch=40, seed=4
    )
    loader = make_loader(mixed, batch_size=BATCH, num_workers=2, persistent_workers=False)
    local = make_loader(mixture(paths), batch_size=BATCH, num_workers=2, persistent_workers=False)
    assert samples(loader) == samples(local)


def test_decoded_fields_and_the_source_column(paths: dict[str, Path]) -> None:
    import torch

    sources = {name: ShardedDataset(path, decode={"cls": "cls"}) for name, path in paths.items()}
    loader = make_loader(Mixture(sources, {"a": 1, "b": 3}), batch_size=BATCH, num_workers=0)
    (batch,) = list(loader)
    assert batch["cls"].dtype == torch.int64 and batch["cls"].shape == (4,)
    assert sorted(batch["__source__"].tolist()) == [0, 1, 1, 1]


def test_monitor_and_metrics_count_per_source(paths: dict[str, Path]) -> None:
    import torch

    from loaders import DistributedMetrics, InputMonitor

    loader = make_loader(mixture(paths), batch_size=BATCH, num_workers=0)
    monitor = InputMonitor(loader)
    metrics = DistributedMetrics(num_classes=2, num_sources=2)
    for batch in monitor:
        source = batch["__source__"]
        losses = source.to(torch.float64)
        metrics.update(torch.ones_like(source), source, loss=losses, pad_mask=batch["__pad__"], source=source)
    assert monitor.last is not None and monitor.last.source_counts == (28, 12)
    assert "per source a 28 (pass 1 at 5), b 12 (pass 1 at 1)" in monitor.summary_line()
    result = metrics.compute()
    assert result["per_source"] == [
        {"accuracy": 0.0, "loss": 0.0, "samples": 28},
        {"accuracy": 1.0, "loss": 1.0, "samples": 12},
    ]
    with pytest.raises(ValueError, match="num_sources"):
        DistributedMetrics(num_classes=2).update(
            torch.zeros(2, dtype=torch.int64),
            torch.zeros(2, dtype=torch.int64),
            source=torch.zeros(2, dtype=torch.int64),
        )


def test_weights_change_by_epoch_and_within_an_epoch(paths: dict[str, Path]) -> None:
    from loaders.planning import Stages

    by_epoch = mixture(paths, weights=[{"a": 0.5, "b": 0.5}, {"a": 0.25, "b": 0.75}])
    assert [by_epoch.mix(e).counts for e in range(3)] == [(20, 20), (10, 30), (10, 30)]
    by_function = mixture(paths, weights=lambda epoch: {"a": 1, "b": epoch + 1}, samples_per_epoch=None)
    assert [by_function.mix(e).counts for e in range(2)] == [(1, 1), (1, 2)]  # counts: N = their sum
    staged = mixture(paths, weights=Stages(((0, {"a": 1.0, "b": 0.0}), (30, {"a": 0.0, "b": 1.0}))))
    loader = make_loader(staged, batch_size=BATCH, num_workers=0)
    assert Counter(s for s, _, pad in samples(loader) if not pad) == {0: 30, 1: 10}


def test_an_empty_source_is_refused(paths: dict[str, Path]) -> None:
    empty = ShardedDataset(paths["b"])
    empty.shard_sizes = [0] * len(empty.shard_sizes)  # a split with no samples, as the check sees it
    with pytest.raises(ValueError, match=r"source 'b' .* has no samples"):
        Mixture({"a": ShardedDataset(paths["a"]), "b": empty}, {"a": 1.0, "b": 1.0})


def test_unshuffled_sources_are_read_in_stored_order(paths: dict[str, Path]) -> None:
    from loaders.planning import epoch_schedule

    sources = {name: ShardedDataset(path, shuffle=False) for name, path in paths.items()}
    mix = Mixture(sources, {"a": 0.7, "b": 0.3}, samples_per_epoch=40)
    got = samples(make_loader(mix, batch_size=BATCH, num_workers=0))
    assert [s for s, _, _ in got] == epoch_schedule(mix.mix(0), 0, 0).tolist()  # the schedule, unpermuted
    a_keys = [key for s, key, _ in got if s == 0]
    everything = sorted(s["__key__"] for s in ShardedDataset(paths["a"], shuffle=False))
    assert a_keys == everything + everything[:5]  # 28 draws: one pass in stored order, then the next begins


def test_continuing_another_runs_passes_is_refused(paths: dict[str, Path]) -> None:
    state = make_loader(mixture(paths), batch_size=BATCH, num_workers=0).state_dict()
    only_a = Mixture({"a": ShardedDataset(paths["a"])}, {"a": 1.0})
    with pytest.raises(ValueError, match=r"cannot continue: found names=\['a', 'b'\]"):
        only_a.continue_passes(state)


def test_every_listed_epochs_weights_are_checked_at_once(paths: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="weight of 'b' must be finite"):
        mixture(paths, weights=[{"a": 1.0, "b": 1.0}, {"a": 1.0, "b": float("nan")}])


def test_a_damaged_source_names_itself_or_its_samples_become_flagged_pads(tmp_path: Path) -> None:
    broken = pack_dataset(tmp_path / "a", "tar", SIZES["a"], max_samples=10)
    where = damage(broken, "tar")
    paths = {"a": broken, "b": pack_dataset(tmp_path / "b", "lmdb", SIZES["b"], max_samples=4)}
    with pytest.raises(DataError, match=f"shard-000001.tar.*{where}"):
        samples(make_loader(mixture(paths), batch_size=BATCH, num_workers=0))
    sources = {n: ShardedDataset(p, rank=0, world_size=1, on_error="skip") for n, p in paths.items()}
    mix = Mixture(sources, weights={"a": 0.7, "b": 0.3}, samples_per_epoch=40, seed=4)
    got = samples(make_loader(mix, batch_size=BATCH, num_workers=0))
    assert len(got) == 40  # steps stay equal: the unreadable sample's slots become flagged pads
    assert Counter(s for s, _, _ in got) == {0: 28, 1: 12}
    pads = [s for s, _, pad in got if pad]
    assert pads and set(pads) == {0} and mix.num_errors == len(pads)


def test_an_unreadable_sample_alone_in_its_sources_part_of_a_window_becomes_a_pad(tmp_path: Path) -> None:
    """Under ``on_error="skip"`` a small source's part of a window may be one sample; when that one cannot
    be read, its slot is filled from another source's readable sample and flagged, as a lone source's bad
    samples are: equal steps, nothing raised."""
    broken = pack_dataset(tmp_path / "c", "tfrecord", 9, max_samples=5)
    damage(broken, "tfrecord")
    paths = {"a": pack_dataset(tmp_path / "a", "tar", 23, max_samples=5), "c": broken}
    sources = {
        n: ShardedDataset(p, shuffle_buffer=4, block_size=1, on_error="skip") for n, p in paths.items()
    }
    mix = Mixture(sources, weights={"a": 0.8, "c": 0.2}, samples_per_epoch=30, seed=3)
    loader = make_loader(mix, batch_size=2, num_workers=0)
    got = []
    for epoch in range(3):  # 18 draws of c's 9 samples: the damaged one is drawn
        loader.set_epoch(epoch)
        got += samples(loader)
    assert len(got) == 90 and mix.num_errors > 0
    assert sum(pad for _, _, pad in got) == mix.num_errors


def test_the_transport_is_sized_by_the_mixture_proportions(paths: dict[str, Path]) -> None:
    """A batch holds each source at its weight, not at its share of the files: the ring's slots are sized
    from the counts (a mixture that took the files' mean sent every batch of a heavy source inline)."""
    for weights, counts in (({"a": 0.7, "b": 0.3}, (28, 12)), ({"a": 0.1, "b": 0.9}, (4, 36))):
        mix = mixture(paths, weights=weights)
        a, b = (d.sample_bytes() for d in mix.datasets)
        assert a != b
        assert mix.sample_bytes() == pytest.approx((counts[0] * a + counts[1] * b) / 40)


@pytest.mark.parametrize("damaged", [False, True])
def test_a_window_landed_in_pieces_is_the_source_by_source_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damaged: bool
) -> None:
    """Three formats, one source's field large enough to land: the same batches, byte for byte, whether
    the sources land straight into the window a batch at a time (``mixed_landing``) or are read one by
    one and gathered; with a damaged sample under ``on_error="skip"``, pieces land until the one that
    holds it, and the rest of the window is read the way that finds it: the same pads, the same count."""
    paths = {
        "a": pack_dataset(tmp_path / "a", "tar", 23, max_samples=5),
        "b": pack_dataset(tmp_path / "b", "lmdb", 11, max_samples=4, size=40_000),
        "c": pack_dataset(tmp_path / "c", "tfrecord", 9, max_samples=3, size=3_000),
    }
    if damaged:
        damage(paths["a"], "tar")

    def batches(lands: bool) -> tuple[list[dict[str, Any]], int, int]:
        pieces: list[int] = []
        real = mixture_module.land_pieces

        def counted(*args: Any) -> Any:
            for piece in real(*args):
                pieces.append(len(piece))
                yield piece

        with monkeypatch.context() as patch:
            patch.setattr(mixture_module, "land_pieces", counted if lands else lambda *a: iter(()))
            on_error = "skip" if damaged else "raise"
            sources = {name: ShardedDataset(path, on_error=on_error) for name, path in paths.items()}
            mix = Mixture(sources, weights={"a": 0.5, "b": 0.3, "c": 0.2}, samples_per_epoch=60, seed=4)
            loader = make_loader(mix, batch_size=BATCH, num_workers=0)
            out = []
            for epoch in (0, 1):
                loader.set_epoch(epoch)
                out += [{k: v if isinstance(v, list) else v.tolist() for k, v in b.items()} for b in loader]
        assert not lands or set(pieces) == {BATCH}  # the one-copy path ran, a batch at a time
        return out, mix.num_errors, len(pieces)

    landed, errors, num_pieces = batches(lands=True)
    assert (landed, errors) == batches(lands=False)[:2]
    assert (errors > 0) == damaged and (num_pieces < 30) == damaged  # 2 epochs of 15 batches


def test_a_mapped_file_cut_short_between_pieces_names_itself(tmp_path: Path) -> None:
    """A window is located once and landed a piece at a time: a shard cut short after the first piece was
    handed out raises naming it at the next piece, never a fault from touching past the file's end."""
    paths = {
        "a": pack_dataset(tmp_path / "a", "tar", 20, max_samples=20, size=20_000),
        "b": pack_dataset(tmp_path / "b", "tfrecord", 10, max_samples=10),
    }
    sources = {name: ShardedDataset(path) for name, path in paths.items()}
    mix = Mixture(sources, weights={"a": 0.5, "b": 0.5}, samples_per_epoch=30, seed=1)
    batches = iter(make_loader(mix, batch_size=BATCH, num_workers=0))
    next(batches)
    with open(paths["a"] / "train" / "shard-000000.tar", "r+b") as shard:
        shard.truncate(1024)
    with pytest.raises(DataError, match=r"shard-000000\.tar.*shorter than when it was opened"):
        list(batches)
