"""``python -m bench.io --profile text``: what ``--compress zstd`` saves and costs on text-like fields.

Two profiles the project generates deterministically (a seeded vocabulary of made-up words drawn with a
Zipf law, as words of real text are): ``json``, records of about 1 KiB (an id, a title, a caption, tags,
numbers), and ``tokens``, ``.npy`` arrays of 256 int32 token ids. Each is packed twice, without and with
``--compress zstd``, into each format that stores small values without block padding (LMDB, TFRecord;
a tar member takes whole 512-byte blocks); then every pack is read in rounds (the pair alternating, so
drift hits both alike) by ``make_loader`` with ``--workers`` workers on the batch path: one epoch of every
sample, shuffled. Reported: stored bytes (shards, indexes and dictionaries), their ratio, samples/s and
the paired read-rate ratio; the issue's target is JSON stored bytes <= 0.4x at >= 0.8x the read rate.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import system
from bench.common.report import Chart, DocsSection, Run, write_report
from loaders import ShardedDataset, make_loader
from shardpipe.manifest import load_manifest
from shardpipe.packing import PackOptions, pack

SECTION = "bench-io-text"
TITLE = "compressed text and token fields (--compress zstd)"
FORMATS = ("lmdb", "tfrecord")
COMPRESS = "zstd"
TARGET_BYTES, TARGET_RATE = 0.4, 0.8
PASSES = 5  # epochs per measured run: about a second of reading, long enough to measure on a busy machine


def vocabulary(size: int, seed: int) -> list[str]:
    """Made-up words of 2-4 syllables, the same for a seed on any machine."""
    rng = np.random.default_rng(seed)
    syllables = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"] + ["th", "qu", "ing", "er"]
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(syllables, size=int(rng.integers(2, 5)))))
    return sorted(words)


def json_records(count: int, seed: int = 0) -> list[bytes]:
    """Records of about 1 KiB: words drawn with a Zipf law from a 5,000-word vocabulary."""
    rng = np.random.default_rng(seed)
    words = vocabulary(5000, seed)
    ranks = np.minimum(rng.zipf(1.2, size=count * 200), len(words)) - 1
    out, at = [], 0
    for i in range(count):
        n = int(rng.integers(120, 160))
        drawn = [words[r] for r in ranks[at : at + n]]
        at += n
        record = {
            "id": i,
            "title": " ".join(drawn[:6]).title(),
            "caption": " ".join(drawn[6:]),
            "tags": sorted(set(drawn[:4])),
            "lang": "en",
            "score": round(float(rng.random()), 4),
            "width": int(rng.integers(200, 2000)),
            "height": int(rng.integers(200, 2000)),
        }
        out.append(json.dumps(record).encode())
    return out


def token_arrays(count: int, seed: int = 0) -> list[bytes]:
    """``.npy`` arrays of 256 int32 token ids, Zipf-drawn from a 50,000-token vocabulary."""
    rng = np.random.default_rng(seed + 1)
    ids = (np.minimum(rng.zipf(1.1, size=(count, 256)), 50_000) - 1).astype(np.int32)
    out = []
    for row in ids:
        buffer = io.BytesIO()
        np.save(buffer, row)
        out.append(buffer.getvalue())
    return out


def write_source(root: Path, field: str, values: list[bytes]) -> None:
    for i, value in enumerate(values):
        folder = root / f"{i // 1000:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:06d}.{field}").write_bytes(value)


def stored_bytes(out: Path) -> int:
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")


def read_rate(out: Path, batch_size: int, workers: int, passes: int) -> float:
    """Samples/s of ``passes`` shuffled epochs through make_loader (the batch path, persistent workers),
    timed from the first batch: the steady rate, without the workers' start."""
    dataset = ShardedDataset(out, shuffle=True, seed=1)
    loader = make_loader(dataset, batch_size=batch_size, num_workers=workers)
    batches = iter(loader)
    next(batches)
    started = time.perf_counter()
    count = sum(len(batch["__key__"]) for batch in batches)
    for epoch in range(1, passes):
        loader.set_epoch(epoch)
        count += sum(len(batch["__key__"]) for batch in loader)
    return count / (time.perf_counter() - started)


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    count = 4000 if args.quick else 40_000
    passes = 1 if args.quick else PASSES
    work = args.cache / "text"
    results = []
    made = {"json": json_records(count), "npy": token_arrays(count)}
    for field, values in made.items():
        src = work / f"src-{field}-{count}"
        if not src.exists():
            write_source(src, field, values)
        payload = sum(map(len, values))
        for fmt in FORMATS:
            outs = {}
            for compress in (None, COMPRESS):
                out = work / f"{field}-{fmt}-{compress or 'plain'}-{count}"
                shutil.rmtree(out, ignore_errors=True)
                options = PackOptions(format=fmt, compress=compress, workers=max(args.workers, 1))
                started = time.perf_counter()
                pack(src, out, options, quiet=True)
                outs[compress] = (out, time.perf_counter() - started)
            rates: dict[str | None, list[float]] = {None: [], COMPRESS: []}
            for _ in range(args.repeats):
                for compress in (None, COMPRESS):
                    rates[compress].append(
                        read_rate(outs[compress][0], args.batch_size, args.workers, passes)
                    )
            plain_bytes, zstd_bytes = stored_bytes(outs[None][0]), stored_bytes(outs[COMPRESS][0])
            paired = statistics.median(z / p for z, p in zip(rates[COMPRESS], rates[None], strict=True))
            manifest = load_manifest(outs[COMPRESS][0])
            results.append(
                {
                    "profile": "json" if field == "json" else "tokens",
                    "format": fmt,
                    "samples": count,
                    "payload_bytes": payload,
                    "plain_bytes": plain_bytes,
                    "zstd_bytes": zstd_bytes,
                    "bytes_ratio": zstd_bytes / plain_bytes,
                    "dictionary": manifest.compression[field].dictionary is not None,
                    "plain_samples_per_s": statistics.median(rates[None]),
                    "zstd_samples_per_s": statistics.median(rates[COMPRESS]),
                    "rate_ratio": paired,
                    "plain_pack_s": outs[None][1],
                    "zstd_pack_s": outs[COMPRESS][1],
                }
            )
    meta = {
        "hardware": system.hardware(),
        "versions": system.versions(),
        "settings": {"batch_size": args.batch_size, "workers": args.workers, "repeats": args.repeats},
    }
    return meta, results


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| profile | format | samples | payload MB | stored MB plain | stored MB zstd | bytes ratio | "
        "dictionary | samples/s plain | samples/s zstd | read-rate ratio (paired) | pack s plain / zstd |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['profile']} | {r['format']} | {r['samples']:,} | {r['payload_bytes'] / 1e6:.1f} | "
            f"{r['plain_bytes'] / 1e6:.1f} | {r['zstd_bytes'] / 1e6:.1f} | {r['bytes_ratio']:.2f}x | "
            f"{'yes' if r['dictionary'] else 'no'} | {r['plain_samples_per_s']:,.0f} | "
            f"{r['zstd_samples_per_s']:,.0f} | {r['rate_ratio']:.2f}x | "
            f"{r['plain_pack_s']:.1f} / {r['zstd_pack_s']:.1f} |"
        )
    return lines


def chart(path: Path, results: list[dict[str, Any]]) -> None:
    """Per profile and format: stored bytes and read rate of the zstd pack against the plain one, with the
    targets (JSON) as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{r['profile']}, {r['format']}" for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(11, 1.2 + 0.45 * len(results)), sharey=True)
    panels = (
        ("bytes_ratio", "stored bytes, zstd / plain (lower is smaller)", TARGET_BYTES),
        ("rate_ratio", "read rate, zstd / plain (paired rounds)", TARGET_RATE),
    )
    for ax, (key, label, target) in zip(axes, panels, strict=True):
        values = [r[key] for r in results]
        ax.barh(names, values, color="tab:blue")
        for i, value in enumerate(values):
            ax.text(value, i, f" {value:.2f}x", va="center", fontsize=8)
        ax.axvline(1.0, color="grey", linewidth=0.8)
        ax.axvline(target, color="tab:red", linestyle="--", linewidth=1, label=f"JSON target {target}x")
        ax.set_xlim(0, max(1.2, *values) * 1.2)
        ax.set_xlabel(label)
        ax.legend(fontsize=8, loc="lower right")
    axes[0].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def verdicts(results: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in results:
        if r["profile"] != "json":
            continue
        met = r["bytes_ratio"] <= TARGET_BYTES and r["rate_ratio"] >= TARGET_RATE
        out.append(
            f"- JSON, {r['format']}: stored bytes {r['bytes_ratio']:.2f}x (target <= {TARGET_BYTES}x), "
            f"read rate {r['rate_ratio']:.2f}x (target >= {TARGET_RATE}x): {'met' if met else 'NOT met'}"
        )
    return out


def main(args: argparse.Namespace, argv: list[str] | None) -> int:
    import sys

    meta, results = measure(args)
    lines = [*table(results), "", *verdicts(results)]
    markdown = "# bench-io --profile text\n\n" + "\n".join(lines) + "\n"
    words = tuple(sys.argv[1:] if argv is None else argv)
    run = Run("bench.io", words, dict(vars(args)), meta["hardware"], meta["versions"])
    rules = {
        "stored bytes": "every file of the pack but its manifest: shards, indexes and dictionaries",
        "read rate": f"{PASSES} shuffled epochs through make_loader (batch path, persistent workers) from "
        "the first batch, median of the runs",
        "read-rate ratio": "zstd over plain, paired by round (the two packs read one after the other)",
    }
    docs = None
    if args.docs:
        docs = DocsSection(args.docs, SECTION, TITLE, rules, lines, {"loader": meta["settings"]})
    figure = Chart(
        "text.png", lambda path: chart(path, results), "zstd against plain: stored bytes, read rate"
    )
    record = {**meta, "results": results}
    paths = write_report(args.out, run, record, markdown, charts=[figure], docs=docs)
    print("\n".join(lines))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
