"""``shardpipe inspect`` (the library's :func:`inspect`): what a packed dataset holds, and how even its
shards are.

The module is named ``inspection`` so that it does not shadow the standard library's ``inspect``; a module
that needs both imports this function under another name (the CLI's ``run_inspect``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from shardpipe.manifest import Manifest, load_manifest
from shardpipe.units import format_size


def inspect(root: Path | str, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The summary of a dataset folder or manifest, a path or a URL (only the manifest is read)."""
    manifest = load_manifest(root, storage_options)
    splits = {}
    for name, shards in manifest.splits.items():
        splits[name] = {
            "shards": len(shards),
            "samples": int(shards.num_samples.sum()),
            "bytes": int(shards.num_bytes.sum()),
            "shard_samples": _spread(shards.num_samples),
            "shard_bytes": _spread(shards.num_bytes),
        }
    return {
        "format": manifest.format,
        "fields": list(manifest.fields),
        "classes": list(manifest.classes) if manifest.classes is not None else None,
        "split_rule": manifest.split_rule,
        "order": manifest.order or None,
        "source": manifest.source,
        "shardpipe_version": manifest.shardpipe_version,
        "fingerprint": manifest.fingerprint(),
        "compression": {
            name: {
                "codec": codec.codec,
                "level": codec.level,
                "dictionary": codec.dictionary is not None,
                **_sizes(manifest, name),
            }
            for name, codec in manifest.compression.items()
        },
        "splits": splits,
    }


def _spread(values: np.ndarray) -> dict[str, int | float]:
    """Min, median and max of a column (0 for a split without shards); a whole median as an int."""
    values = values if values.size else np.zeros(1, dtype=np.int64)
    median = float(np.median(values))
    return {
        "min": int(values.min()),
        "median": int(median) if median.is_integer() else median,
        "max": int(values.max()),
    }


def _sizes(manifest: Manifest, name: str) -> dict[str, int]:
    """A compressed field's bytes over the pack, as given and as stored (none where the shards do not
    record them: packs written before they did)."""
    found = [shards.compressed_bytes(name) for shards in manifest.splits.values() if len(shards)]
    totals = [sizes for sizes in found if sizes is not None]
    if not totals or len(totals) < len(found):
        return {}
    return {"given_bytes": sum(t[0] for t in totals), "stored_bytes": sum(t[1] for t in totals)}


def render(summary: dict[str, Any]) -> str:
    lines = [
        f"format: {summary['format']}    fields: {', '.join(summary['fields'])}    "
        f"fingerprint: {summary['fingerprint']}",
    ]
    if summary["classes"] is not None:
        classes = summary["classes"]
        shown = ", ".join(classes[:12]) + (f", … ({len(classes)} in all)" if len(classes) > 12 else "")
        lines.append(f"classes: {shown}")
    if summary.get("compression"):
        stored = [
            f"{name} ({entry['codec']}:{entry['level']}{', dictionary' if entry['dictionary'] else ''}"
            + (
                f", {format_size(entry['given_bytes'])} -> {format_size(entry['stored_bytes'])}, "
                f"{entry['given_bytes'] / max(entry['stored_bytes'], 1):,.2f}x)"
                if "given_bytes" in entry
                else ")"
            )
            for name, entry in summary["compression"].items()
        ]
        lines.append(f"compressed: {', '.join(stored)}")
    if summary.get("order"):
        order = summary["order"]
        lines.append(f"order: {order['method']}" + (f" (seed {order['seed']})" if "seed" in order else ""))
    header = (
        f"{'split':<10} {'shards':>7} {'samples':>12} {'MB':>10}   samples/shard min/median/max   MB/shard"
    )
    lines += ["", header, "-" * len(header)]
    for name, split in summary["splits"].items():
        counts, sizes = split["shard_samples"], split["shard_bytes"]
        lines.append(
            f"{name:<10} {split['shards']:>7,} {split['samples']:>12,} {split['bytes'] / 1e6:>10,.1f}   "
            f"{counts['min']:,} / {counts['median']:,.0f} / {counts['max']:,}"
            f"{'':<12}{sizes['min'] / 1e6:,.1f} / {sizes['median'] / 1e6:,.1f} / {sizes['max'] / 1e6:,.1f}"
        )
    return "\n".join(lines)
