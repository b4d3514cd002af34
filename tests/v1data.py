"""Turn a dataset packed now into what shardpipe wrote before per-sample checksums (manifest version 1)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from shardpipe.formats.layout import CHECKSUM
from shardpipe.manifest import DIGEST_KEY, load_manifest


def downgrade_to_v1(root: Path) -> None:
    """Indexes lose their checksum column, LMDB records their checksum; the manifest becomes version 1."""
    manifest = load_manifest(root)
    data = json.loads((root / "manifest.json").read_text())
    for name in ("index_version", "sample_checksum", DIGEST_KEY):
        del data[name]
    data["manifest_version"] = 1
    width = 4 + 2 * len(manifest.fields)
    for split in data["splits"].values():
        for shard in split["shards"]:
            if shard.get("index"):
                path = root / shard["index"]["path"]
                table = np.fromfile(path, dtype="<u8").reshape(-1, width)
                raw = np.delete(table, CHECKSUM, axis=1).astype("<u8").tobytes()
                path.write_bytes(raw)
                shard["index"]["sha256"] = hashlib.sha256(raw).hexdigest()
            if manifest.format == "lmdb":
                path = root / shard["path"]
                _strip_lmdb_checksums(path)
                shard["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
                shard["bytes"] = path.stat().st_size
        split["bytes"] = sum(s["bytes"] for s in split["shards"])
    (root / "manifest.json").write_text(json.dumps(data, indent=1))


def _strip_lmdb_checksums(path: Path) -> None:
    import lmdb

    from shardpipe.formats.lmdb_env import COUNT_KEY, VERSION_KEY

    with lmdb.open(str(path), subdir=False, lock=False) as env, env.begin(write=True) as txn:
        for key, value in list(txn.cursor()):
            if key not in (COUNT_KEY, VERSION_KEY):
                txn.put(key, value[:-8])
        txn.put(VERSION_KEY, b"1")
