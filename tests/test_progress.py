"""Progress on a long pack: the count moves inside a shard (the writers' tally), each silent phase says
what it does, and a log ends with one summary line."""

from __future__ import annotations

import io
import re
from pathlib import Path

from shardpipe.packing import PackOptions, pack, tally
from shardpipe.packing.engine import local_pool
from shardpipe.progress import Progress, phase
from tests.datagen import make_tree


def add_to_tally(samples: int) -> None:
    tally.count(samples, 10 * samples)


def test_the_pool_workers_count_into_the_drivers_tally() -> None:
    with local_pool(2) as pool:
        assert pool is not None
        written = tally.current()
        assert written is not None
        list(pool.map(add_to_tally, [3, 4, 5]))
        assert written.read() == (12, 120)
    assert tally.current() is None  # nothing counts after the pack


def test_one_shard_moves_the_count_as_its_batches_are_written(tmp_path: Path, monkeypatch) -> None:
    """One shard of 6 MiB, written in 1 MiB batches by this process: the log shows counts below the
    total before the shard is finished, then one summary."""
    make_tree(tmp_path / "src", 24, fields=("bin",), size=256 << 10)
    lines = io.StringIO()
    monkeypatch.setattr("shardpipe.packing.driver.Progress", _logging_every_update(lines))
    pack(tmp_path / "src", tmp_path / "out", PackOptions(format="tar", workers=1))
    counts = [
        int(m[1].replace(",", "")) for m in re.finditer(r"pack tar: ([\d,]+)/24 samples", lines.getvalue())
    ]
    assert counts[-1] == 24 and any(0 < count < 24 for count in counts)
    assert len([line for line in lines.getvalue().splitlines() if line.startswith("pack tar: 24/24")]) == 1


def _logging_every_update(stream: io.StringIO) -> type:
    class Logged(Progress):
        def __init__(self, description: str, total: int, **options: object) -> None:
            super().__init__(description, total, stream=stream, log_every_s=0.0, quiet=False)

    return Logged


def test_a_phase_says_what_it_does_and_how_long_it_took() -> None:
    out = io.StringIO()
    with phase("compress", "training dictionaries", stream=out):
        pass
    assert re.fullmatch(
        r"compress: training dictionaries\.\.\.\ncompress: done in [\d.]+ s\n", out.getvalue()
    )
    quiet = io.StringIO()
    with phase("scan", "listing", stream=quiet, quiet=True):
        pass
    assert quiet.getvalue() == ""
