"""``python -m bench.io --profile text``: its data is deterministic and of the sizes it claims, and its
table and verdicts are built from what it measured."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from bench.io import text_profile


def test_the_generated_records_and_token_arrays() -> None:
    records = text_profile.json_records(50)
    assert records == text_profile.json_records(50) and len(set(records)) == 50
    assert 800 <= sum(map(len, records)) / 50 <= 1300  # about 1 KiB
    arrays = text_profile.token_arrays(3)
    row = np.load(io.BytesIO(arrays[0]), allow_pickle=False)
    assert row.dtype == np.int32 and row.shape == (256,) and arrays == text_profile.token_arrays(3)


def test_the_table_and_verdicts() -> None:
    result = {
        "profile": "json",
        "format": "lmdb",
        "samples": 10,
        "payload_bytes": 10_000,
        "plain_bytes": 12_000,
        "zstd_bytes": 3_000,
        "bytes_ratio": 0.25,
        "dictionary": True,
        "plain_samples_per_s": 100.0,
        "zstd_samples_per_s": 90.0,
        "rate_ratio": 0.9,
        "plain_pack_s": 1.0,
        "zstd_pack_s": 1.5,
    }
    assert "| json | lmdb | 10 |" in text_profile.table([result])[2]
    assert text_profile.verdicts([result]) == [
        "- JSON, lmdb: stored bytes 0.25x (target <= 0.4x), read rate 0.90x (target >= 0.8x): met"
    ]
    assert "NOT met" in text_profile.verdicts([{**result, "rate_ratio": 0.5}])[0]


def test_the_chart_draws_both_ratios(tmp_path: Path) -> None:
    results = [
        {"profile": "json", "format": "lmdb", "bytes_ratio": 0.3, "rate_ratio": 0.9},
        {"profile": "tokens", "format": "tar", "bytes_ratio": 0.8, "rate_ratio": 1.0},
    ]
    text_profile.chart(tmp_path / "text.png", results)
    assert (tmp_path / "text.png").read_bytes().startswith(b"\x89PNG")
